#!/usr/bin/env bash
# The sharding stages (--shard, ZeRO-1/2/3, issues 25 and 39) against the replicated run, side by side in one run: an MLP whose
# Adam state is over 1 GB, at 1, 2 and 4 ranks. Per run of h5ddp-train: peak RSS of every rank (GNU time
# around each rank), training throughput (samples/s of the last logged interval), the final save's seconds
# (fsync on), then a second run that only resumes (load_seconds of metrics.jsonl, peak RSS of the load).
# The modes' order rotates by repetition. Prints medians; raw lines go to $LOG.
#
#   tools/bench/zero_bench.sh [build-dir]   env: REPS=2 RANKS="1 2 4" HIDDEN=6144,6144,6144,6144,6144 STEPS=3
#                                                BATCH=8 DIR=/tmp (run directories; one checkpoint at a time)
#                                                MODES="replicated optimizer gradients parameters" (--shard ...;
#                                                  parameters-noprefetch: --shard parameters --shard-prefetch off)
#                                                MODEL_ARGS="--model-file gpt.pt --data tokens.h5" (default: the MLP)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${H5DDP_BINARY_DIR:-$here/../../build}}
train=$build/tools/h5ddp-train
python=${H5DDP_PYTHON:-/usr/bin/python3}
REPS=${REPS:-2}
MODES=${MODES:-replicated optimizer gradients parameters}
RANKS=${RANKS:-"1 2 4"}
HIDDEN=${HIDDEN:-6144,6144,6144,6144,6144}
STEPS=${STEPS:-3}
BATCH=${BATCH:-8}
DIR=${DIR:-/tmp}
LOG=${LOG:-$(mktemp /tmp/h5ddp-zero-bench-XXXXXX.log)}
[[ -x $train ]] || { echo "missing $train" >&2; exit 2; }
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HDF5_USE_FILE_LOCKING=FALSE
mpirun=(mpirun --oversubscribe --bind-to none)
run_dir=$DIR/h5ddp-zero-bench
trap 'rm -rf "$run_dir"' EXIT

# one MODE NP REP: a training run (STEPS steps, final save) and a resume-only run; appends RESULT lines.
one() {
  local mode=$1 np=$2 rep=$3 flags=()
  [[ $mode != replicated ]] && flags=(--shard "${mode%-noprefetch}")
  [[ $mode == *-noprefetch ]] && flags+=(--shard-prefetch off)
  rm -rf "$run_dir"
  local model
  read -ra model <<<"${MODEL_ARGS:---model mlp --mlp-hidden $HIDDEN}"
  local common=("${model[@]}" --batch-size "$BATCH" --no-eval --keep-last 1
    --log-every "$STEPS" --run-dir "$run_dir" "${flags[@]}")
  "${mpirun[@]}" -np "$np" /usr/bin/time -f "RSS_KB %M" "$train" "${common[@]}" --max-steps "$STEPS" \
    >"$run_dir.train.log" 2>&1 || { cat "$run_dir.train.log"; exit 1; }
  "${mpirun[@]}" -np "$np" /usr/bin/time -f "RSS_KB %M" "$train" "${common[@]}" --max-steps "$STEPS" \
    --no-final-checkpoint >"$run_dir.load.log" 2>&1 || { cat "$run_dir.load.log"; exit 1; }
  "$python" - "$run_dir" "$mode" "$np" "$rep" <<'EOF' | tee -a "$LOG"
import json, sys
run, mode, np, rep = sys.argv[1:]
recs = [json.loads(l) for l in open(run + "/metrics.jsonl")]
train = [r for r in recs if r["event"] == "train"][-1]
save = [r for r in recs if r["event"] == "save"][-1]
load = [r for r in recs if r["event"] == "resume"][-1]
rss = lambda log: [int(l.split()[1]) // 1024 for l in open(log) if l.startswith("RSS_KB")]
tr, ld = rss(run + ".train.log"), rss(run + ".load.log")
print(f"RESULT rep={rep} mode={mode} np={np} samples_per_s={train['samples_per_s']:.3f} save_s={save['seconds']:.3f} "
      f"load_s={load['load_seconds']:.3f} bytes={save['bytes']} train_rss_mib_max={max(tr)} "
      f"train_rss_mib={','.join(map(str, tr))} load_rss_mib_max={max(ld)}")
EOF
}

echo "# $(date -u +%FT%TZ) $(nproc --all) cores, ${MODEL_ARGS:-MLP hidden $HIDDEN}, batch $BATCH, $STEPS steps, load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$LOG"
for rep in $(seq 1 "$REPS"); do
  for np in $RANKS; do
    read -ra modes <<<"$MODES"
    for k in "${!modes[@]}"; do one "${modes[(k + rep - 1) % ${#modes[@]}]}" "$np" "$rep"; done
  done
done
"$python" - "$LOG" <<'EOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("RESULT"):
        continue
    kv = dict(re.findall(r"(\w+)=([^ ]+)", line))
    rows.setdefault((int(kv["np"]), kv["mode"]), []).append(kv)
med = lambda rs, k: statistics.median(float(r[k]) for r in rs)
print("| ranks | optimizer | peak RSS per rank, train (MiB, max) | peak RSS, load | samples/s | save s | load s |")
print("|---|---|---|---|---|---|---|")
for (np, mode), rs in sorted(rows.items()):
    print(f"| {np} | {mode} | {med(rs, 'train_rss_mib_max'):.0f} | {med(rs, 'load_rss_mib_max'):.0f} | "
          f"{med(rs, 'samples_per_s'):.2f} | {med(rs, 'save_s'):.2f} | {med(rs, 'load_s'):.2f} |")
for np, mode in sorted(rows):
    if mode != "replicated" and (np, "replicated") in rows:
        r, s = rows[(np, "replicated")], rows[(np, mode)]
        print(f"ranks {np}: {mode}/replicated peak RSS {med(s, 'train_rss_mib_max') / med(r, 'train_rss_mib_max'):.2f}, "
              f"throughput {med(s, 'samples_per_s') / med(r, 'samples_per_s'):.2f}, save time "
              f"{med(s, 'save_s') / med(r, 'save_s'):.2f}, load time {med(s, 'load_s') / med(r, 'load_s'):.2f}")
EOF
echo "raw: $LOG"

#!/usr/bin/env bash
# Language-model training throughput (issue 40), side by side in one run: h5ddp-train (C++, MPI, the scripted
# example GPT, fp32 and --precision bf16) against PyTorch DDP (Python, gloo, tools/bench/lm_bench.py: the same GPT
# class eager, the same windows, global batch, Adam and lr) at 2 and 4 ranks; runs interleaved, the order rotating by
# repetition, so every variant sees the same machine load. Prints medians of tokens/s (after warm-up steps) and the
# loss after the last step; raw RESULT lines go to $LOG.
#
#   tools/bench/lm_bench.sh [build-dir]   env: REPS=3 RANKS="2 4" STEPS=30 WARMUP=5 BATCH=32 CONTEXT=64 LAYERS=2
#                                              HEADS=4 DIM=64 TEXT=/usr/share/games/fortunes (any text file or dir)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$here/../..
build=${1:-$root/build}
py=/usr/bin/python3
REPS=${REPS:-3}; RANKS=${RANKS:-"2 4"}; STEPS=${STEPS:-30}; WARMUP=${WARMUP:-5}; BATCH=${BATCH:-32}
CONTEXT=${CONTEXT:-64}; LAYERS=${LAYERS:-2}; HEADS=${HEADS:-4}; DIM=${DIM:-64}
TEXT=${TEXT:-/usr/share/games/fortunes}
[[ -e $TEXT ]] || TEXT=/usr/share/common-licenses/GPL-3
LOG=${LOG:-$(mktemp /tmp/h5ddp-lm-bench-XXXXXX.log)}
work=$(mktemp -d /tmp/h5ddp-lm-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe --bind-to none)

$py "$root/tools/h5ddp-data.py" text "$TEXT" --context "$CONTEXT" --test-fraction 0 -o "$work/data.h5" >/dev/null
$py "$root/tools/examples/gpt.py" script -o "$work/gpt.pt" --context "$CONTEXT" --layers "$LAYERS" --heads "$HEADS" \
  --dim "$DIM" >/dev/null
lr=1e-3

# tokens/s of an h5ddp-train run: its per-step train records' times, after the warm-up steps; the last loss.
h5ddp_result() {  # name np run_dir
  $py - "$@" "$WARMUP" "$BATCH" "$CONTEXT" <<'PY'
import json, sys
name, np_, run, warm, batch, t = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:])
recs = [r for r in map(json.loads, open(run + "/metrics.jsonl")) if r["event"] == "train"]
a, b = recs[warm - 1], recs[-1]
tps = (b["step"] - a["step"]) * batch * t / (b["time"] - a["time"])
print(f"RESULT framework={name} ranks={np_} tokens_per_s={tps:.0f} loss={b['loss']:.4f}")
PY
}
run_h5ddp() {  # name np extra...
  local name=$1 np=$2; shift 2
  local run=$work/$name-$np-$rep
  "${mpirun[@]}" -np "$np" "$build/tools/h5ddp-train" --model-file "$work/gpt.pt" --data "$work/data.h5" \
    --batch-size "$BATCH" --max-steps "$STEPS" --optimizer adam --lr "$lr" --no-eval --no-final-checkpoint \
    --no-fsync --threads 1 --log-every 1 --resume none --run-dir "$run" "$@" >"$run.log" 2>&1 \
    || { cat "$run.log" >&2; exit 1; }
  h5ddp_result "$name" "$np" "$run" | sed "s/^RESULT/RESULT rep=$rep/" | tee -a "$LOG"
}
run_pytorch() {  # np
  "${mpirun[@]}" -np "$1" $py "$here/lm_bench.py" --data "$work/data.h5" --context "$CONTEXT" --batch "$BATCH" \
    --steps $((STEPS - WARMUP)) --warmup "$WARMUP" --layers "$LAYERS" --heads "$HEADS" --dim "$DIM" \
    --optimizer adam --lr "$lr" 2>&1 | grep '^RESULT' | sed "s/^RESULT/RESULT rep=$rep/" | tee -a "$LOG"
}
for rep in $(seq 1 "$REPS"); do
  for np in $RANKS; do
    order=("h5ddp" "pytorch" "h5ddp-bf16")
    for k in 0 1 2; do
      v=${order[$(((k + rep) % 3))]}
      case $v in
        h5ddp) run_h5ddp h5ddp "$np" ;;
        h5ddp-bf16) run_h5ddp h5ddp-bf16 "$np" --precision bf16 ;;
        pytorch) run_pytorch "$np" ;;
      esac
    done
  done
done
$py - "$LOG" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = dict(re.findall(r"(\w+)=(\S+)", line))
    rows.setdefault((f["framework"], int(f["ranks"])), []).append((float(f["tokens_per_s"]), float(f["loss"])))
print(f"{'framework':<12} {'ranks':>5} {'tokens/s (median)':>18} {'vs pytorch':>10} {'loss after last step':>21}")
for (fw, np_), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    tps = statistics.median(x for x, _ in v)
    base = statistics.median(x for x, _ in rows[("pytorch", np_)]) if ("pytorch", np_) in rows else float("nan")
    print(f"{fw:<12} {np_:>5} {tps:>18.0f} {tps / base:>9.2f}x {statistics.median(l for _, l in v):>21.4f}")
PY
echo "raw results: $LOG"

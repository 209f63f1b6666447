#!/usr/bin/env bash
# Side-by-side DDP benchmark: h5ddp (C++, MPI) vs PyTorch DDP (Python, gloo), same models and batches,
# at 1, 2 and 4 ranks, runs interleaved so both see the same machine load; which one runs first alternates by
# repetition (h5ddp then pytorch, pytorch then h5ddp, ...).
# Prints a table of medians over the repetitions; raw RESULT lines go to $LOG.
#
#   tools/bench/ddp_bench.sh [build-dir]        env: REPS=3 RANKS="1 2 4" MODELS="cnn mlp" MODES="auto" (MpiComm's default) or e.g. "progress thread nonblocking"
#                                                    WAITS="auto" (or "spin sleep": H5DDP_MPI_WAIT for each h5ddp run)
#                                                    BIND=auto (mpirun --bind-to for both frameworks: auto = core,
#                                                    with overload-allowed when ranks > cores; or none, socket, ...)
#                                                    PY_MALLOC=0 (1: also run PyTorch with glibc malloc tuned as
#                                                    h5ddp's MpiEnv tunes it, row "pytorch+malloc")
#                                                    COMPETE=0 (that many single-threaded busy loops run beside
#                                                    both frameworks for the whole run: the same competing load)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${H5DDP_BINARY_DIR:-$here/../../build}}
bench=$build/tools/bench/h5ddp-bench-ddp
python=${H5DDP_PYTHON:-/usr/bin/python3}
REPS=${REPS:-3}
RANKS=${RANKS:-"1 2 4"}
MODELS=${MODELS:-"cnn mlp"}
MODES=${MODES:-auto}
WAITS=${WAITS:-auto}
LOG=${LOG:-$(mktemp /tmp/h5ddp-ddp-bench-XXXXXX.log)}
CNN_ARGS=${CNN_ARGS:-"--model cnn --batch 64 --steps 20 --warmup 3"}
MLP_ARGS=${MLP_ARGS:-"--model mlp --hidden 4096 --layers 4 --batch 16 --steps 5 --warmup 2"}
[[ -x $bench ]] || { echo "missing $bench: cmake --build $build --target h5ddp-bench-ddp" >&2; exit 2; }

cores=$(nproc --all)  # before OMP_NUM_THREADS=1, which nproc obeys
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
BIND=${BIND:-auto}
port=29600
# run_h5ddp / run_pytorch: one run of each framework at $np ranks (mpirun, args, np and rep are set by the
# loops below); record tags every RESULT line with its repetition and appends it to $LOG.
record() { grep RESULT | sed "s/^RESULT/RESULT rep=$rep/" | tee -a "$LOG"; }
run_h5ddp() {
  for mode in $MODES; do
    for wait in $WAITS; do
      waitenv=(); [[ $wait == auto ]] || waitenv=(-x H5DDP_MPI_WAIT="$wait")
      modeenv=(); [[ $mode == auto ]] || modeenv=(-x H5DDP_MPI_ASYNC="$mode")
      timeout 900 "${mpirun[@]}" "${modeenv[@]}" "${waitenv[@]}" -np "$np" "$bench" $args | record
    done
  done
}
run_pytorch() {
  port=$((port + 1))
  MASTER_PORT=$port timeout 900 "${mpirun[@]}" -x MASTER_PORT -np "$np" "$python" "$here/ddp_bench.py" $args 2>/dev/null | record
  if [[ ${PY_MALLOC:-0} == 1 ]]; then
    port=$((port + 1))
    MASTER_PORT=$port MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=536870912 MALLOC_TOP_PAD_=67108864 \
      timeout 900 "${mpirun[@]}" -x MASTER_PORT -x MALLOC_MMAP_THRESHOLD_ -x MALLOC_TRIM_THRESHOLD_ -x MALLOC_TOP_PAD_ \
      -np "$np" "$python" "$here/ddp_bench.py" $args 2>/dev/null | record
  fi
}
COMPETE=${COMPETE:-0}
competitors=()
for ((i = 0; i < COMPETE; i++)); do
  "$python" -c 'while True: pass' & competitors+=($!)
done
trap '[[ ${#competitors[@]} -eq 0 ]] || kill "${competitors[@]}" 2>/dev/null' EXIT
echo "# $(date -u +%FT%TZ) $cores cores, bind $BIND, $COMPETE competing busy loops, load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$LOG"
for model in $MODELS; do
  args=$CNN_ARGS; [[ $model == mlp ]] && args=$MLP_ARGS
  for np in $RANKS; do
    bind=$BIND
    if [[ $bind == auto ]]; then
      if (( np > cores )); then bind=core:overload-allowed; else bind=core; fi
    fi
    mpirun=(mpirun --oversubscribe --bind-to "$bind")
    # Which framework runs first alternates: on this VM a run's speed depends on what ran just before it,
    # so a fixed order would hand one framework the same position in every repetition.
    for rep in $(seq "$REPS"); do
      if (( rep % 2 )); then run_h5ddp; run_pytorch; else run_pytorch; run_h5ddp; fi
    done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOG"
"$python" - "$LOG" <<'PY'
# Ratios: the machine's speed drifts by up to 3x between runs (a shared VM), so besides medians of times
# the table gives the median of *paired* ratios (each h5ddp run against the PyTorch run next to it, same
# repetition) and the ratio of the best (minimum) times; both are throughput h5ddp / PyTorch.
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("RESULT"):
        continue
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    impl = kv["impl"] + ("/" + kv["async"] if "async" in kv else "") + ("/" + kv["waiting"] if "waiting" in kv else "")
    rows.setdefault((kv["model"], int(kv["ranks"])), {}).setdefault(impl, []).append(kv)
med = lambda xs, k: statistics.median(float(x[k]) for x in xs)
print(f"\n{'model':5} {'ranks':>5} {'impl':20} {'local ms':>9} {'ddp ms':>9} {'comm ms':>8} {'wait ms':>8} "
      f"{'hidden':>6} {'ddp/local':>9} {'paired ratio':>12} {'best ratio':>10} {'vs tuned':>8}")
for (model, np), impls in sorted(rows.items()):
    py = impls.get("pytorch")
    py_by_rep = {x.get("rep"): float(x["ddp_ms"]) for x in py} if py else {}
    tuned = impls.get("pytorch+malloc")  # PY_MALLOC=1: paired ratio against PyTorch with malloc tuned too
    tuned_by_rep = {x.get("rep"): float(x["ddp_ms"]) for x in tuned} if tuned else {}
    for impl, xs in sorted(impls.items()):
        local, ddp = med(xs, "local_ms"), med(xs, "ddp_ms")
        comm = f"{med(xs, 'comm_ms'):8.1f}" if "comm_ms" in xs[0] else f"{'-':>8}"
        wait = f"{med(xs, 'wait_ms'):8.1f}" if "wait_ms" in xs[0] else f"{'-':>8}"
        hidden = f"{med(xs, 'hidden_wait'):6.2f}" if "hidden_wait" in xs[0] else f"{'-':>6}"
        paired = best = vs_tuned = ""
        if tuned and impl.startswith("h5ddp"):
            pairs = [tuned_by_rep[x.get("rep")] / float(x["ddp_ms"]) for x in xs if x.get("rep") in tuned_by_rep]
            vs_tuned = f"{statistics.median(pairs):.2f}" if pairs else "-"
        if py and impl != "pytorch":
            pairs = [py_by_rep[x.get("rep")] / float(x["ddp_ms"]) for x in xs if x.get("rep") in py_by_rep]
            paired = f"{statistics.median(pairs):.2f}" if pairs else "-"
            best = f"{min(float(x['ddp_ms']) for x in py) / min(float(x['ddp_ms']) for x in xs):.2f}"
        print(f"{model:5} {np:5d} {impl:20} {local:9.1f} {ddp:9.1f} {comm} {wait} {hidden} {ddp / local:9.2f} "
              f"{paired:>12} {best:>10} {vs_tuned:>8}")
print("(times: medians of", max(len(v) for i in rows.values() for v in i.values()), "runs; comm = the bucket allreduces"
      " alone; wait = time finish_backward waited after backward; hidden = 1 - wait/comm; paired ratio = median"
      " over repetitions of pytorch ddp ms / h5ddp ddp ms; best ratio = min pytorch ddp ms / min h5ddp ddp ms;"
      " vs tuned = the paired ratio against pytorch+malloc)")
PY

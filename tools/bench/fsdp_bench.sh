#!/usr/bin/env bash
# ZeRO-3 prefetch (FsdpOptions::prefetch, --shard-prefetch) against blocking gathers and against replicated training:
# h5ddp-bench-fsdp per model and rank count, its three configurations alternating within the one MPI job. Models:
# the MLP of docs/BENCHMARKS_TRAINING.md "Sharded training state" (8 hidden layers of 4256, 130 M parameters) and a GPT scripted
# by tools/examples/gpt.py (4 layers, dim 256, context 64, vocabulary 256, tied head). Prints the RESULT/RATIO lines
# and a markdown table of median step times; raw lines go to $LOG.
#
#   tools/bench/fsdp_bench.sh [build-dir]   env: RANKS="2 4" MODELS="mlp gpt" MLP_HIDDEN=4256 x8 MLP_BATCH=8
#                                                MLP_STEPS=3 MLP_ROUNDS=3 GPT_BATCH=8 GPT_STEPS=5 GPT_ROUNDS=6
#                                                CONFIGS=replicated,prefetch,blocking (h5ddp-bench-fsdp --configs) WARMUP=2
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${H5DDP_BINARY_DIR:-$here/../../build}}
bench=$build/tools/bench/h5ddp-bench-fsdp
python=${H5DDP_PYTHON:-/usr/bin/python3}
RANKS=${RANKS:-"2 4"}
MODELS=${MODELS:-"mlp gpt"}
MLP_HIDDEN=${MLP_HIDDEN:-4256,4256,4256,4256,4256,4256,4256,4256}
MLP_BATCH=${MLP_BATCH:-8} MLP_STEPS=${MLP_STEPS:-3} MLP_ROUNDS=${MLP_ROUNDS:-3}
GPT_BATCH=${GPT_BATCH:-8} GPT_STEPS=${GPT_STEPS:-5} GPT_ROUNDS=${GPT_ROUNDS:-6}
CONFIGS=${CONFIGS:-replicated,prefetch,blocking}
LOG=${LOG:-$(mktemp /tmp/h5ddp-fsdp-bench-XXXXXX.log)}
[[ -x $bench ]] || { echo "missing $bench (cmake --build BUILD --target h5ddp-bench-fsdp)" >&2; exit 2; }
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HDF5_USE_FILE_LOCKING=FALSE
mpirun=(mpirun --oversubscribe --bind-to none)
work=$(mktemp -d /tmp/h5ddp-fsdp-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "# $(date -u +%FT%TZ) $(nproc --all) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$LOG"
for model in $MODELS; do
  if [[ $model == gpt ]]; then
    "$python" "$here/../examples/gpt.py" script -o "$work/gpt.pt" --vocab-size 256 --context 64 --dim 256 --layers 4 \
      --heads 4 --tie-weights | tee -a "$LOG"
    args=(--model gpt --model-file "$work/gpt.pt" --batch "$GPT_BATCH" --steps "$GPT_STEPS" --rounds "$GPT_ROUNDS")
  else
    args=(--model mlp --hidden "$MLP_HIDDEN" --batch "$MLP_BATCH" --steps "$MLP_STEPS" --rounds "$MLP_ROUNDS")
  fi
  args+=(--configs "$CONFIGS" --warmup "${WARMUP:-2}")
  for np in $RANKS; do
    echo "# mpirun -np $np h5ddp-bench-fsdp ${args[*]}" | tee -a "$LOG"
    "${mpirun[@]}" -np "$np" "$bench" "${args[@]}" 2>&1 | grep -E '^(RESULT|RATIO|# async)' | tee -a "$LOG"
  done
done

"$python" - "$LOG" <<'EOF'
import re, sys
rows, ratios = {}, {}
for line in open(sys.argv[1]):
    kv = dict(re.findall(r"(\S+)=(\S+)", line))
    if line.startswith("RESULT"):
        rows.setdefault((kv["model"], kv["np"]), {})[kv["config"]] = kv
    elif line.startswith("RATIO"):
        for k, v in kv.items():
            if "/" in k:
                ratios[(kv["model"], kv["np"], k)] = v
print("| model | ranks | replicated ms | stage 3 prefetch ms | stage 3 blocking ms | prefetch / blocking "
      "| prefetch / replicated | gather ms per step (prefetch / blocking) | ms per unit gather (blocking) |")
print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
for (model, np), c in rows.items():
    g = lambda name, key: c.get(name, {}).get(key, "-")
    print(f"| {model} | {np} | {g('replicated', 'median_ms')} | {g('prefetch', 'median_ms')} | "
          f"{g('blocking', 'median_ms')} | {ratios.get((model, np, 'prefetch/blocking'), '-')} | "
          f"{ratios.get((model, np, 'prefetch/replicated'), '-')} | "
          f"{g('prefetch', 'gather_ms_per_step')} / {g('blocking', 'gather_ms_per_step')} | "
          f"{g('blocking', 'ms_per_unit_gather')} |")
EOF

#!/usr/bin/env bash
# Evaluation speed (docs/BENCHMARKS_TRAINING.md "Evaluation speed"): CPU time per image of the evaluation forward beside a
# training step's forward, for the CNN and the MLP, with glibc's default heap thresholds and with the heap kept
# (keep_freed_memory_in_heap, what h5ddp-ckpt eval and a replicated h5ddp-train use); then `h5ddp-ckpt eval` of a
# default-job checkpoint, timed whole (user + sys), as the issue that found it measured it.
#   tools/bench/eval_bench.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
export OMP_NUM_THREADS=1
for model in cnn mlp; do
  for heap in default keep; do "$build/tools/bench/h5ddp-bench-eval" --model "$model" --heap "$heap" --rounds 2 --images 5000; done
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun --allow-run-as-root --oversubscribe -np 2 "$build/tools/h5ddp-train" --run-dir "$work/run" --max-steps 20 \
  --no-eval --resume none >/dev/null
for i in 1 2 3; do
  /usr/bin/time -f "h5ddp-ckpt eval (10k images): %U s user %S s sys %e s wall" \
    "$build/tools/h5ddp-ckpt" eval "$work/run/ckpt-00000020.h5" >/dev/null
done

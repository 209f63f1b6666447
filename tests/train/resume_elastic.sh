#!/usr/bin/env bash
# Elastic resume (issue 5): one run continued at changing world sizes, 4 -> 2 -> 1 -> 4 ranks, against the
# same run uninterrupted at 1 rank. Same global batch and sample order, so counters and data position
# match exactly; with dropout 0 the weights match within the tolerance of a different summation order
# (the gradient allreduce adds the per-rank means in another order): SGD elementwise --rtol 1e-4
# --atol 1e-6; Adam per tensor ||a-b|| <= 1e-5 ||b|| (Adam turns rounding-level gradients into
# lr-sized updates of either sign; see compare_checkpoints in tests/support/h5ddp_test.py).
# With `shard` (issue 25) the legs alternate ZeRO-1 and replicated optimizers: 4 sharded -> 2 replicated ->
# 1 sharded -> 4 sharded, against the replicated 1-rank reference, within the same tolerance.
#   resume_elastic.sh OPTIMIZER [shard]
source "$(dirname "$0")/lib.sh"
opt=$1 mode=${2:-}
args=(--optimizer "$opt" --dropout 0 --seed 3 --data-dir "$SMALL_DATA")
[ "$opt" = sgd ] && args+=(--lr 0.05 --momentum 0.9)

run_train 1 "$WORK/ref.log" "${args[@]}" --max-steps 16 --run-dir "$WORK/ref" ||
  { cat "$WORK/ref.log"; fail "reference run failed"; }
steps=4
prev=""
leg=0
for np in 4 2 1 4; do
  leg_args=()
  [ "$mode" = shard ] && [ $leg -ne 1 ] && leg_args+=(--shard-optimizer)
  leg=$((leg + 1))
  run_train "$np" "$WORK/e$steps.log" "${args[@]}" "${leg_args[@]}" --max-steps $steps --run-dir "$WORK/e" ||
    { cat "$WORK/e$steps.log"; fail "elastic leg to step $steps at $np ranks failed"; }
  if [ -n "$prev" ]; then
    grep -q "resumed from .*ckpt-$(printf %08d $prev).h5 at step $prev,.*saved at $prev_np ranks\?, now $np" "$WORK/e$steps.log" ||
      { cat "$WORK/e$steps.log"; fail "leg at $np ranks did not resume from step $prev saved at $prev_np ranks"; }
  fi
  prev=$steps prev_np=$np
  steps=$((steps + 4))
done
if [ "$opt" = sgd ]; then tol=(--rtol 1e-4 --atol 1e-6); else tol=(--norm-rtol 1e-5); fi
compare "$WORK/ref/ckpt-00000016.h5" "$WORK/e/ckpt-00000016.h5" --skip-rng "${tol[@]}"
echo "PASS: elastic resume 4 -> 2 -> 1 -> 4 ranks with $opt ${mode}"

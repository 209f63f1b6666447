#!/usr/bin/env bash
# --async-checkpoint writes the same files as synchronous saves: every checkpoint of a run with periodic
# async saves is bitwise equal to the synchronous run's at the same step, and a resume from an async
# checkpoint continues exactly.
#   async_equals_sync.sh NP
source "$(dirname "$0")/lib.sh"
np=$1
args=(--max-steps 9 --checkpoint-every-steps 3 --dropout 0.25 --data-dir "$SMALL_DATA")
run_train "$np" "$WORK/s.log" "${args[@]}" --run-dir "$WORK/sync" || { cat "$WORK/s.log"; fail "sync run failed"; }
run_train "$np" "$WORK/a.log" "${args[@]}" --run-dir "$WORK/async" --async-checkpoint ||
  { cat "$WORK/a.log"; fail "async run failed"; }
for s in 00000003 00000006 00000009; do
  compare "$WORK/sync/ckpt-$s.h5" "$WORK/async/ckpt-$s.h5"
done
echo "PASS: async checkpoints equal synchronous ones at $np ranks"

#!/usr/bin/env bash
# Scale (issue 42): 16 ranks on this machine, oversubscribed, a small model.
#  1. Kill and resume bitwise at 16 ranks: S steps uninterrupted == checkpoint at K, SIGKILL of every rank, resume,
#     run to S; every model/optimizer tensor, counter and RNG row compared bit for bit (dropout on: the 16 ranks'
#     generators must each come back as they were).
#  2. 16 -> 3 -> 16: the uninterrupted run's checkpoint at K continued at 3 ranks with a sharded optimizer (ZeRO-1)
#     to 2K, then at 16 ranks (replicated) to S, against the uninterrupted run at S: Adam per tensor within
#     ||a-b|| <= 1e-5 ||b|| (another world size adds the per-rank gradient means in another order; dropout off so
#     that the masks do not depend on the world size; tests/train/resume_elastic.sh explains the tolerance).
# The global batch (48) divides by 16 and by 3, so both world sizes see the same samples in the same order.
BATCH_SIZE=48 RUN_TIMEOUT=400
source "$(dirname "$0")/lib.sh"
S=12 K=4
base=(--optimizer adam --seed 5 --data-dir "$SMALL_DATA" --mlp-hidden 64
  --checkpoint-every-steps $K)

# 1. bitwise kill/resume at 16 ranks (dropout 0.25)
args=("${base[@]}" --dropout 0.25 --max-steps $S)
run_train 16 "$WORK/a.log" "${args[@]}" --run-dir "$WORK/a" || { cat "$WORK/a.log"; fail "uninterrupted run failed"; }
[ -f "$WORK/a/ckpt-00000012.h5" ] || fail "no final checkpoint of the uninterrupted run"
start_train 16 "$WORK/b1.log" "${args[@]}" --run-dir "$WORK/b" --step-sleep-ms 300
wait_for 400 latest_is "$WORK/b" ckpt-00000004.h5
kill_job "$JOB_PID"
JOB_PID=""
[ ! -f "$WORK/b/ckpt-00000012.h5" ] || fail "the interrupted run finished before it was killed"
run_train 16 "$WORK/b2.log" "${args[@]}" --run-dir "$WORK/b" || { cat "$WORK/b2.log"; fail "resumed run failed"; }
grep -q "resumed from .*ckpt-0000000[48].h5 at step [48]" "$WORK/b2.log" ||
  { cat "$WORK/b2.log"; fail "did not resume from a checkpoint of the killed run"; }
compare "$WORK/a/ckpt-00000012.h5" "$WORK/b/ckpt-00000012.h5"
echo "PASS: SIGKILL and bitwise resume at 16 ranks"

# 2. 16 -> 3 (sharded optimizer) -> 16 (dropout 0)
args=("${base[@]}" --dropout 0)
run_train 16 "$WORK/r.log" "${args[@]}" --max-steps $S --run-dir "$WORK/r" || { cat "$WORK/r.log"; fail "16-rank reference failed"; }
mkdir -p "$WORK/e"
cp "$WORK/r/ckpt-00000004.h5" "$WORK/e/"
echo ckpt-00000004.h5 >"$WORK/e/latest"
run_train 3 "$WORK/e3.log" "${args[@]}" --run-dir "$WORK/e" --shard-optimizer --max-steps $((2 * K)) ||
  { cat "$WORK/e3.log"; fail "3-rank leg failed"; }
grep -q "resumed from .*ckpt-00000004.h5 at step 4,.*saved at 16 ranks, now 3" "$WORK/e3.log" ||
  { cat "$WORK/e3.log"; fail "3-rank leg did not resume the 16-rank checkpoint"; }
run_train 16 "$WORK/e16.log" "${args[@]}" --max-steps $S --run-dir "$WORK/e" || { cat "$WORK/e16.log"; fail "16-rank leg failed"; }
grep -q "resumed from .*ckpt-00000008.h5 at step 8,.*saved at 3 ranks, now 16" "$WORK/e16.log" ||
  { cat "$WORK/e16.log"; fail "16-rank leg did not resume the 3-rank checkpoint"; }
compare "$WORK/r/ckpt-00000012.h5" "$WORK/e/ckpt-00000012.h5" --skip-rng --norm-rtol 1e-5
echo "PASS: 16 -> 3 (sharded) -> 16 ranks within 1e-5"

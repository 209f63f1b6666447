#!/usr/bin/env bash
# Bitwise exact resume (issue 5): S steps uninterrupted == checkpoint at step K, SIGKILL of every rank,
# resume, run to S; every model/optimizer tensor, counter and RNG row compared bit for bit.
# With `shard` both runs use --shard-optimizer (ZeRO-1, issue 25): each rank saves and reloads only its shard;
# with `gradients`, --shard gradients (ZeRO-2, issue 39: row pieces of split tensors, only its gradient range kept);
# with `parameters`, --shard parameters (ZeRO-3: the CNN's weights too are held and saved as row pieces).
#   resume_exact.sh NP OPTIMIZER [shard|gradients|parameters]
source "$(dirname "$0")/lib.sh"
np=$1 opt=$2 mode=${3:-}
S=12 K=5
args=(--optimizer "$opt" --dropout 0.25 --max-steps $S --seed 11 --data-dir "$SMALL_DATA")
[ "$opt" = sgd ] && args+=(--lr 0.05 --momentum 0.9)
[ "$mode" = shard ] && args+=(--shard-optimizer)
[ "$mode" = gradients ] && args+=(--shard gradients)
[ "$mode" = parameters ] && args+=(--shard parameters)

run_train "$np" "$WORK/a.log" "${args[@]}" --run-dir "$WORK/a" || { cat "$WORK/a.log"; fail "uninterrupted run failed"; }
[ -f "$WORK/a/ckpt-00000012.h5" ] || fail "no final checkpoint of the uninterrupted run"

# Throttled so the kill lands between the checkpoint at K and the next one at 2K.
start_train "$np" "$WORK/b1.log" "${args[@]}" --run-dir "$WORK/b" --checkpoint-every-steps $K --step-sleep-ms 400
wait_for 90 latest_is "$WORK/b" ckpt-00000005.h5
kill_job "$JOB_PID"
JOB_PID=""
[ ! -f "$WORK/b/ckpt-00000012.h5" ] || fail "the interrupted run finished before it was killed"

run_train "$np" "$WORK/b2.log" "${args[@]}" --run-dir "$WORK/b" --checkpoint-every-steps $K ||
  { cat "$WORK/b2.log"; fail "resumed run failed"; }
grep -q "resumed from .*ckpt-00000005.h5 at step 5" "$WORK/b2.log" ||
  { cat "$WORK/b2.log"; fail "did not resume from the step-5 checkpoint"; }
compare "$WORK/a/ckpt-00000012.h5" "$WORK/b/ckpt-00000012.h5"
echo "PASS: exact resume at $np ranks with $opt ${mode}"

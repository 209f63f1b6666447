#!/usr/bin/env bash
# SIGKILL of one rank mid-training: the job ends within a bounded time (mpirun tears down the rest, no
# rank hangs in a collective), and a restart resumes from the last committed checkpoint.
#   kill_one_rank.sh NP
source "$(dirname "$0")/lib.sh"
np=$1
args=(--max-steps 12 --checkpoint-every-steps 3 --run-dir "$WORK/k" --data-dir "$SMALL_DATA")
start_train "$np" "$WORK/k1.log" "${args[@]}" --step-sleep-ms 300
wait_for 90 latest_is "$WORK/k" ckpt-00000003.h5
target=$(rank_pids "$JOB_PID" | tail -n 1)
[ -n "$target" ] || fail "no rank process found under mpirun $JOB_PID"
kill -9 "$target"
t0=$SECONDS
timeout 60 tail --pid="$JOB_PID" -f /dev/null || fail "job still running 60 s after one rank was killed"
rc=0
wait "$JOB_PID" || rc=$?
JOB_PID=""
echo "job ended $((SECONDS - t0)) s after the kill, exit code $rc"
[ "$rc" -ne 0 ] || fail "job reported success although a rank was killed"
# The newest committed checkpoint (highest step: the rename is the commit point, `latest` may lag it by a save).
last=$(cd "$WORK/k" && ls ckpt-*.h5 | sort | tail -n 1)
[ ! -f "$WORK/k/ckpt-00000012.h5" ] || fail "the run finished before the kill"
run_train "$np" "$WORK/k2.log" "${args[@]}" || { cat "$WORK/k2.log"; fail "restart failed"; }
grep -q "resumed from .*$last" "$WORK/k2.log" || { cat "$WORK/k2.log"; fail "restart did not resume from $last"; }
[ -f "$WORK/k/ckpt-00000012.h5" ] || fail "restart did not finish"
echo "PASS: one of $np ranks killed; restart resumed from $last"

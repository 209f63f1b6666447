#!/usr/bin/env bash
# A stop signal delivered to ONE rank only (not through mpirun): all ranks agree at the next step boundary,
# every rank writes its share of one checkpoint, and the job exits 75 ("requeue me") after SIGUSR1 or
# SIGTERM, 130 ("interrupted") after SIGINT, with the stop message. A rerun resumes from that checkpoint.
#   signal_one_rank.sh NP [USR1|TERM|INT]      (default USR1)
source "$(dirname "$0")/lib.sh"
np=$1
sig=${2:-USR1}
case "$sig" in
  USR1 | TERM) code=75 why="requeue me" ;;
  INT) code=130 why="interrupted" ;;
  *) fail "unknown signal $sig" ;;
esac
args=(--max-steps 1000 --run-dir "$WORK/r")
start_train "$np" "$WORK/s.log" "${args[@]}" --step-sleep-ms 100
wait_for 90 grep -q "^step 3/" "$WORK/s.log"
target=$(rank_pids "$JOB_PID" | tail -n 1)
[ -n "$target" ] || fail "no rank process found under mpirun $JOB_PID"
kill -"$sig" "$target"
rc=0
timeout 60 tail --pid="$JOB_PID" -f /dev/null || fail "job did not end within 60 s of the signal"
wait "$JOB_PID" || rc=$?
JOB_PID=""
[ "$rc" -eq "$code" ] || { cat "$WORK/s.log"; fail "SIG$sig: exit code $rc, expected $code"; }
ckpt=$(cat "$WORK/r/latest") || fail "no checkpoint after the signal"
grep -q "stopped by a signal at step .*saved .*$ckpt.*exit code $code ($why)" "$WORK/s.log" ||
  { cat "$WORK/s.log"; fail "no stop message"; }
"$PY" - "$WORK/r/$ckpt" "$np" <<'PYEOF'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    ws, step = int(f.attrs["world_size"]), int(f["train/step"][()])
    assert ws == int(sys.argv[2]), f"world_size {ws}"
    assert f["rng/cpu"].shape[0] == ws, "one RNG row per rank"
    assert 3 <= step < 1000, f"step {step}"
    print(f"checkpoint at step {step} written by {ws} ranks")
PYEOF
step=$(echo "$ckpt" | sed 's/ckpt-0*\([0-9]*\)\.h5/\1/')
run_train "$np" "$WORK/s2.log" --max-steps $((step + 2)) --run-dir "$WORK/r" || { cat "$WORK/s2.log"; fail "rerun failed"; }
grep -q "resumed from .*$ckpt at step $step" "$WORK/s2.log" || { cat "$WORK/s2.log"; fail "rerun did not resume"; }
echo "PASS: SIG$sig to one of $np ranks saved at step $step and exited $code"

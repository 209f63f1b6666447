#!/usr/bin/env bash
# The README's own-loop example (DDP + Checkpointer in a user's program) is killed and resumed, and ends
# bitwise equal to a run that was never interrupted: model, optimizer state, tracked user state (/user),
# every rank's RNG, counters and data position (tests/support/h5ddp_test.py compare, everything compared).
#   own_loop_resume.sh BINARY NP kill|usr1
# kill: SIGKILL of every rank after the step-100 checkpoint; usr1: SIGUSR1 to one rank -> all ranks save,
# exit 75 (requeue me); in both cases the same command then resumes and finishes.
set -euo pipefail
bin=$1 np=$2 mode=$3
here="$(cd "$(dirname "$0")" && pwd)"
PY="${H5DDP_PYTHON:-/usr/bin/python3}"
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE
work="$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-own-loop-XXXXXX")"
job=""
cleanup() {
  if [ -n "$job" ]; then
    pkill -9 -P "$job" 2>/dev/null || true
    kill -9 "$job" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
steps=300

timeout -k 5 300 "${MPIRUN[@]}" -np "$np" "$bin" "$work/ref" $steps >"$work/ref.log" 2>&1 ||
  { cat "$work/ref.log"; fail "uninterrupted run failed"; }

# The interrupted run sleeps 40 ms a step so that the signal lands mid-run.
"${MPIRUN[@]}" -np "$np" "$bin" "$work/run" $steps 40 >"$work/run1.log" 2>&1 &
job=$!
deadline=$((SECONDS + 240))
until [ -f "$work/run/ckpt-00000100.h5" ]; do
  kill -0 "$job" 2>/dev/null || { cat "$work/run1.log"; fail "the run ended before step 100"; }
  [ $SECONDS -lt $deadline ] || fail "no step-100 checkpoint after 240 s"
  sleep 0.05
done
ranks=$(pgrep -P "$job" -f "$(basename "$bin")" || true)
[ -n "$ranks" ] || fail "no rank processes under mpirun $job"
rc=0
if [ "$mode" = kill ]; then
  kill -9 $ranks
  kill -9 "$job" 2>/dev/null || true
  wait "$job" 2>/dev/null || rc=$?
  [ "$rc" -ne 0 ] || fail "the killed job reported success"
else
  kill -USR1 "$(echo "$ranks" | tail -n 1)"  # one rank only: the ranks agree, all save
  timeout 120 tail --pid="$job" -f /dev/null || fail "no exit 120 s after SIGUSR1"
  wait "$job" || rc=$?
  [ "$rc" -eq 75 ] || { cat "$work/run1.log"; fail "exit code $rc after SIGUSR1, expected 75"; }
fi
job=""
[ ! -f "$work/run/ckpt-00000300.h5" ] || fail "the run finished before the $mode"
saved=$(cd "$work/run" && ls ckpt-*.h5 | sort | tail -n 1)

timeout -k 5 300 "${MPIRUN[@]}" -np "$np" "$bin" "$work/run" $steps >"$work/run2.log" 2>&1 ||
  { cat "$work/run2.log"; fail "the resumed run failed"; }
grep -q "resumed from .*$saved at step" "$work/run2.log" || { cat "$work/run2.log"; fail "did not resume from $saved"; }
"$PY" "$here/../support/h5ddp_test.py" compare "$work/ref/ckpt-00000300.h5" "$work/run/ckpt-00000300.h5" ||
  fail "the resumed run's final checkpoint differs from the uninterrupted run's"
for g in /user/fc2_ema; do
  h5ls "$work/run/ckpt-00000300.h5$g" >/dev/null || fail "no $g in the checkpoint"
done
echo "PASS: $mode at $np ranks after $saved; final checkpoint bitwise equal to the uninterrupted run's"

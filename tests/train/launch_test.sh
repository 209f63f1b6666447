#!/usr/bin/env bash
# How a run is launched and stopped, as docs/TRAINING.md states it (issue 44, defects 2, 4, 5):
#   orphan     SIGKILL to a plain mpirun: its ranks die with it, by the kernel's hand (no orphan goes on to commit
#              a checkpoint after the prompt is back, as after a second Ctrl-C to mpirun);
#   mpirun_int Ctrl-C (SIGINT) to a plain mpirun: Open MPI sends TERM to the ranks, they save, and mpirun
#              exits 1 (docs/TRAINING.md's exit-code table says so: jobs/train-local.sh is the launcher giving 130);
#   hint       the end-of-run "resume" line continues the run: no --resume/--init-from, and the mpirun line
#              carries --allow-run-as-root when run as root; under jobs/train-local.sh it is the script's line;
#   local_np4  jobs/train-local.sh with more ranks than cores and no extra mpirun options runs (oversubscribed).
#   usage: launch_test.sh CASE
source "$(dirname "$0")/lib.sh"
case_name=${1:?usage: launch_test.sh orphan|mpirun_int|hint|local_np4}
SCRIPT="$HERE/../../jobs/train-local.sh"

# A long run whose steps are cheap: 2 ranks, 50 ms a step.
long_args() { echo --run-dir "$1" --model mlp --mlp-hidden 16 --max-steps 2000 --step-sleep-ms 50 --checkpoint-every-steps 20; }

case "$case_name" in
orphan)
  # shellcheck disable=SC2046
  H5DDP_LOG_LEVEL=debug start_train 2 "$WORK/run.log" $(long_args "$WORK/run")
  wait_for 90 test -s "$WORK/run/latest"
  ranks=$(rank_pids "$JOB_PID")
  [ "$(echo "$ranks" | wc -l)" -eq 2 ] || fail "expected 2 ranks under mpirun $JOB_PID, found: $ranks"
  # Open MPI's own check ends orphans about 1 s later, from its progress thread; a rank busy in a long save can
  # still commit meanwhile. The kernel's SIGKILL (PR_SET_PDEATHSIG, armed at start: both ranks say so) does not wait.
  [ "$(grep -c "started by mpirun (pid $JOB_PID): dies with it" "$WORK/run.log")" -eq 2 ] ||
    { cat "$WORK/run.log"; fail "the ranks did not arm PR_SET_PDEATHSIG against their mpirun"; }
  kill -9 "$JOB_PID"
  wait "$JOB_PID" 2>/dev/null || true
  JOB_PID=""
  deadline=$((SECONDS + 5))
  for p in $ranks; do
    while kill -0 "$p" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then
        kill -9 $ranks 2>/dev/null || true
        fail "rank $p outlived its SIGKILLed mpirun by 5 s (an orphan that keeps training and saving)"
      fi
      sleep 0.05
    done
  done
  before=$(ls "$WORK/run")
  sleep 2
  [ "$(ls "$WORK/run")" = "$before" ] || fail "the run dir changed after mpirun and its ranks were gone"
  echo "PASS: the ranks died with their SIGKILLed mpirun"
  ;;
mpirun_int)
  # shellcheck disable=SC2046
  start_train 2 "$WORK/run.log" $(long_args "$WORK/run")
  wait_for 90 test -s "$WORK/run/latest"
  kill -INT "$JOB_PID"
  rc=0
  wait "$JOB_PID" || rc=$?
  JOB_PID=""
  grep -q "stopped by a signal at step [0-9]*; saved .*ckpt-.*exit code 75" "$WORK/run.log" ||
    { cat "$WORK/run.log"; fail "the ranks did not save after SIGINT to mpirun"; }
  [ "$rc" -eq 1 ] || { cat "$WORK/run.log"; fail "mpirun exited $rc after SIGINT; README says 1"; }
  echo "PASS: SIGINT to a plain mpirun: the ranks saved (TERM), mpirun exited 1 as documented"
  ;;
hint)
  run_train 2 "$WORK/raw.log" --run-dir "$WORK/raw" --model mlp --mlp-hidden 16 --max-steps 3 --resume none ||
    { cat "$WORK/raw.log"; fail "raw mpirun run failed"; }
  line=$(grep -A1 "^resume (" "$WORK/raw.log" | tail -1)
  [[ $line == *"mpirun -np 2 "* ]] || fail "no mpirun resume line: '$line'"
  [[ $line != *"--resume"* ]] || fail "the resume line starts over (--resume none): '$line'"
  if [ "$(id -u)" -eq 0 ]; then [[ $line == *"--allow-run-as-root"* ]] || fail "as root, the line lacks --allow-run-as-root: '$line'"; fi
  # Run exactly what it says: it must continue (nothing left to train at step 3, so a note, no new start).
  eval "timeout -k 5 120 $line" >"$WORK/again.log" 2>&1 || { cat "$WORK/again.log"; fail "the printed resume line failed: $line"; }
  grep -q "nothing to train: .*ckpt-00000003.h5 is at step 3" "$WORK/again.log" ||
    { cat "$WORK/again.log"; fail "the printed resume line did not continue the run"; }
  cp "$WORK/raw/ckpt-00000003.h5" "$WORK/init.h5"
  H5DDP_RUN_DIR="$WORK/local" H5DDP_TRAIN="$TRAIN" timeout -k 5 120 "$SCRIPT" --model mlp --mlp-hidden 16 \
    --max-steps 2 --no-eval --init-from "$WORK/init.h5" >"$WORK/local.log" 2>&1 || { cat "$WORK/local.log"; fail "train-local.sh"; }
  line=$(grep -A1 "^resume (" "$WORK/local.log" | tail -1)
  [[ $line == *"H5DDP_RUN_DIR="*" "*"train-local.sh --model mlp --mlp-hidden 16 --max-steps 2 --no-eval" ]] ||
    fail "train-local.sh's resume line is not the script's own: '$line'"
  echo "PASS: resume lines continue the run (raw mpirun and jobs/train-local.sh)"
  ;;
local_np4)
  H5DDP_NP=4 H5DDP_RUN_DIR="$WORK/np4" H5DDP_TRAIN="$TRAIN" timeout -k 5 200 "$SCRIPT" --model mlp --mlp-hidden 16 \
    --max-steps 2 --no-eval --batch-size 16 >"$WORK/np4.log" 2>&1 || { cat "$WORK/np4.log"; fail "H5DDP_NP=4 train-local.sh"; }
  grep -q "trained to step 2 .* at 4 ranks" "$WORK/np4.log" || { cat "$WORK/np4.log"; fail "not 4 ranks"; }
  echo "PASS: H5DDP_NP=4 jobs/train-local.sh on $(nproc) cores"
  ;;
*) fail "unknown case $case_name" ;;
esac

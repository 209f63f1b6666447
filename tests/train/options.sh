#!/usr/bin/env bash
# h5ddp-train's options: --help documents every option with its default; bad values fail before any
# training with a clear message and a non-zero exit on every rank (no hang); a short run prints the test
# accuracy, where the checkpoint is, and how to resume and inspect it.
source "$(dirname "$0")/lib.sh"

help=$("$TRAIN" --help)
for opt in config data-dir run-dir threads seed model dropout mlp-hidden epochs max-steps batch-size lr \
  optimizer momentum weight-decay lr-schedule lr-step-size lr-gamma step-sleep-ms progress log-every no-eval \
  checkpoint-every-steps checkpoint-every-seconds keep-last keep-every no-fsync async-checkpoint no-final-checkpoint \
  resume init-from; do
  grep -q -- "--$opt" <<<"$help" || fail "--help does not document --$opt"
done
for code in "75 saved" "130 saved" "1 error" "2 bad options" "70 a step or save stalled"; do
  grep -q -- "$code" <<<"$help" || fail "--help does not document exit code '$code'"
done
grep -q "(=120)" <<<"$help" || fail "--help does not show defaults"

# expect_error NP PATTERN ARGS...: the run fails (non-zero) within the timeout and says PATTERN.
expect_error() {
  local np=$1 pattern=$2
  shift 2
  local rc=0
  run_train "$np" "$WORK/err.log" "$@" || rc=$?
  [ "$rc" -ne 0 ] || { cat "$WORK/err.log"; fail "'$*' succeeded"; }
  [ "$rc" -ne 124 ] || fail "'$*' hung"
  grep -q -- "$pattern" "$WORK/err.log" || { cat "$WORK/err.log"; fail "'$*' did not say '$pattern'"; }
}
COMMON=(--no-eval --no-fsync)
expect_error 2 "batch-size 0: must be positive" --batch-size 0 --run-dir "$WORK/x"
expect_error 2 "unknown model" --model resnet --run-dir "$WORK/x"
expect_error 2 "unknown optimizer" --optimizer lamb --run-dir "$WORK/x"
expect_error 2 "unknown shard prefetch (on | off)" --shard-prefetch maybe --run-dir "$WORK/x"
expect_error 2 "data directory not found: /nonexistent-fmnist" --data-dir /nonexistent-fmnist --run-dir "$WORK/x"
expect_error 2 "cannot create run directory /proc/h5ddp-run" --run-dir /proc/h5ddp-run
touch "$WORK/file"
expect_error 2 "cannot create run directory $WORK/file/run" --run-dir "$WORK/file/run"
expect_error 2 "not divisible by the 2 ranks" --batch-size 15 --run-dir "$WORK/x"
expect_error 1 "no such checkpoint" --resume "$WORK/none.h5" --run-dir "$WORK/x"
printf 'model = cnn\nbatch-size = 0\n' >"$WORK/bad.cfg"
expect_error 1 "batch-size 0" --config "$WORK/bad.cfg" --run-dir "$WORK/x"

# A short run with evaluation and the end-of-run report; options from a config file.
printf 'max-steps = 6\nlr = 0.002\n' >"$WORK/ok.cfg"
run_train 2 "$WORK/ok.log" --config "$WORK/ok.cfg" --eval-placeholder 2>/dev/null && fail "unknown option accepted"
COMMON=(--batch-size 16 --no-fsync)
run_train 2 "$WORK/ok.log" --config "$WORK/ok.cfg" --run-dir "$WORK/run" || { cat "$WORK/ok.log"; fail "short run failed"; }
for pattern in "^step 6/6" "test accuracy: [0-9.]*% on 10000 images" "checkpoint: $WORK/run/ckpt-00000006.h5" \
  "mpirun -np 2 .*h5ddp-train" "h5ddp-ckpt info $WORK/run/ckpt-00000006.h5"; do
  grep -q -- "$pattern" "$WORK/ok.log" || { cat "$WORK/ok.log"; fail "end-of-run report lacks '$pattern'"; }
done
acc=$(sed -n 's/^test accuracy: \([0-9.]*\)%.*/\1/p' "$WORK/ok.log")
# 6 Adam steps on 96 images already beat chance (10%) by far.
awk -v a="$acc" 'BEGIN { exit !(a > 30) }' || fail "accuracy $acc% after 6 steps"
# --init-from takes the weights only: a fresh run (step 0, new run dir) that starts from them.
run_train 1 "$WORK/init.log" --init-from "$WORK/run/ckpt-00000006.h5" --max-steps 1 --no-eval --run-dir "$WORK/run2" ||
  { cat "$WORK/init.log"; fail "--init-from run failed"; }
grep -q "initialised the weights from $WORK/run/ckpt-00000006.h5" "$WORK/init.log" || { cat "$WORK/init.log"; fail "no init message"; }
[ -f "$WORK/run2/ckpt-00000001.h5" ] || fail "--init-from run did not start at step 0"
# Rerun with the same --init-from (a requeued fine-tune): continues its own checkpoint, does not start over.
run_train 1 "$WORK/init2.log" --init-from "$WORK/run/ckpt-00000006.h5" --max-steps 2 --no-eval --run-dir "$WORK/run2" ||
  { cat "$WORK/init2.log"; fail "--init-from rerun failed"; }
grep -q "resumed from $WORK/run2/ckpt-00000001.h5 at step 1" "$WORK/init2.log" ||
  { cat "$WORK/init2.log"; fail "the --init-from rerun did not continue its own run"; }
# --init-from in a run dir that holds another run's checkpoints: refused, naming both files, nothing written.
cp "$WORK/run2/ckpt-00000002.h5" "$WORK/other-init.h5"
before=$(ls "$WORK/run")
rc=0
run_train 1 "$WORK/init3.log" --init-from "$WORK/other-init.h5" --max-steps 8 --run-dir "$WORK/run" || rc=$?
[ "$rc" -eq 1 ] || { cat "$WORK/init3.log"; fail "--init-from into another run's dir exited $rc, expected 1"; }
grep -q "error: .*--init-from $WORK/other-init.h5 starts a fresh run, .*found $WORK/run/ckpt-00000006.h5" "$WORK/init3.log" ||
  { cat "$WORK/init3.log"; fail "the refusal does not name both files"; }
[ "$(ls "$WORK/run")" = "$before" ] || fail "the refused --init-from changed $WORK/run"
rc=0
run_train 1 "$WORK/init4.log" --init-from "$WORK/other-init.h5" --resume "$WORK/run/ckpt-00000006.h5" || rc=$?
[ "$rc" -eq 2 ] && grep -q "init-from.*pass one of the two" "$WORK/init4.log" ||
  { cat "$WORK/init4.log"; fail "--init-from with --resume PATH exited $rc, expected 2 and a message"; }
# A --config file takes a flag alone on its line, as the command line does.
printf 'max-steps = 1\nno-final-checkpoint\nrun-dir = %s\n' "$WORK/run-config" >"$WORK/flags.cfg"
run_train 1 "$WORK/config.log" --config "$WORK/flags.cfg" || { cat "$WORK/config.log"; fail "--config with a bare flag"; }
[ ! -f "$WORK/run-config/ckpt-00000001.h5" ] || fail "the bare 'no-final-checkpoint' in --config was not applied"
echo "PASS: options, validation and report (accuracy after 6 steps: $acc%)"

#!/usr/bin/env bash
# jobs/train-local.sh (mpirun on one machine, no Slurm): TERM to the script mid-run must make every rank
# save and the script exit 75; running it again must resume from that checkpoint and complete, with a
# final checkpoint equal to an uninterrupted run's (h5ddp-ckpt diff; h5py when the tool is not built).
#   usage: train_local_test.sh /path/to/h5ddp-train [/path/to/h5ddp-ckpt]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script="$here/../../jobs/train-local.sh"
train=${1:?usage: $0 /path/to/h5ddp-train [/path/to/h5ddp-ckpt]}
ckpt_tool=${2:-}
python=${H5DDP_PYTHON:-/usr/bin/python3}
[ -x "$train" ] || { echo "FAIL: $train is not an executable" >&2; exit 1; }
export OMP_NUM_THREADS=1 H5DDP_TRAIN="$train" H5DDP_NP=2 H5DDP_MPIRUN_ARGS=--oversubscribe

readonly kMaxSteps=40
final_name=$(printf 'ckpt-%08d.h5' "$kMaxSteps")
args=(--epochs 1 --max-steps "$kMaxSteps" --checkpoint-every-steps 10 --step-sleep-ms 100 --seed 11
  --batch-size 64 --model mlp --mlp-hidden 32 --keep-last 0 --no-eval --no-fsync --threads 1)

work=$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-train-local.XXXXXX")
status=1
run_pid=""
ref_pid=""
finish() {
  local p
  for p in $run_pid $ref_pid; do kill -0 "$p" 2>/dev/null && kill -TERM "$p" 2>/dev/null; done
  keep_logs_on_failure
}
trap finish EXIT
# shellcheck source=test_lib.sh
. "$here/test_lib.sh"

# Uninterrupted reference, alongside the interrupted run.
H5DDP_RUN_DIR="$work/ref" timeout 180 "$script" "${args[@]}" >"$work/ref.out" 2>&1 &
ref_pid=$!

# Interrupted run: TERM to the script once the first checkpoint is committed.
H5DDP_RUN_DIR="$work/run" timeout 120 "$script" "${args[@]}" >"$work/run1.out" 2>&1 &
run_pid=$!
for _ in $(seq 1 900); do
  [ -s "$work/run/latest" ] && break
  kill -0 "$run_pid" 2>/dev/null || break
  sleep 0.1
done
[ -s "$work/run/latest" ] || fail "no checkpoint within 90 s"
# `timeout` relays TERM to the script it runs.
kill -TERM "$run_pid"
rc=0
wait "$run_pid" || rc=$?
run_pid=""
[ "$rc" -eq 75 ] || { cat "$work/run1.out" >&2; fail "interrupted run exited $rc, expected 75"; }

rc=0
wait "$ref_pid" || rc=$?
ref_pid=""
[ "$rc" -eq 0 ] || { cat "$work/ref.out" >&2; fail "reference run exited $rc"; }

# Same command again: resumes and completes.
rc=0
H5DDP_RUN_DIR="$work/run" timeout 120 "$script" "${args[@]}" >"$work/run2.out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$work/run2.out" >&2; fail "resumed run exited $rc"; }
resumed=$(grep -o "resumed from [^ ]* at step [0-9]*" "$work/run2.out" | head -1 | sed 's/.* at step //' || true)
{ [ -n "$resumed" ] && [ "$resumed" -gt 0 ] && [ "$resumed" -lt "$kMaxSteps" ]; } ||
  fail "the second run did not resume mid-run (resumed at '${resumed}')"

if [ -f "$work/ref/$final_name" ] && [ -f "$work/run/$final_name" ]; then
  rc=0
  if [ -n "$ckpt_tool" ]; then
    "$ckpt_tool" diff "$work/ref/$final_name" "$work/run/$final_name" >"$work/diff.out" 2>&1 || rc=$?
  else
    "$python" "$here/../support/h5ddp_test.py" compare --datasets-only "$work/ref/$final_name" "$work/run/$final_name" >"$work/diff.out" 2>&1 || rc=$?
  fi
  [ "$rc" -eq 0 ] || { cat "$work/diff.out" >&2; fail "$final_name differs from the uninterrupted run's ($rc)"; }
else
  fail "missing $final_name (ref or interrupted run)"
fi

if [ "$failures" -eq 0 ]; then
  status=0
  echo "PASS: train-local.sh saved on TERM (exit 75), resumed at step $resumed, final checkpoint equal"
fi
exit "$status"

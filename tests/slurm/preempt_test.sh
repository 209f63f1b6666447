#!/usr/bin/env bash
# Preemption on a real (private, one-node) Slurm, end to end:
#   1. submit jobs/train.sbatch with 2 tasks and a short, throttled run;
#   2. once the first periodic checkpoint is committed, preempt it, by one of
#        signal:    `scancel --signal=USR1 --batch` (what `--signal=B:USR1@T` does before a time limit);
#        scheduler: a job in a higher-priority partition that needs the job's CPUs (PreemptMode=REQUEUE:
#                   Slurm sends the job's --signal at once and requeues it itself);
#   3. the job must save, exit 75, requeue itself, start again with SLURM_RESTART_COUNT=1, resume from
#      its checkpoint and complete;
#   4. its final checkpoint must equal, tensor by tensor, that of an uninterrupted `mpirun -np 2` run with
#      the same options (h5ddp-ckpt diff; h5py when the tool is not built).
# Every daemon is stopped by PID on exit, also on failure (local_slurm.sh stop in an EXIT trap).
#   usage: preempt_test.sh signal|scheduler /path/to/h5ddp-train [/path/to/h5ddp-ckpt]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
usage="usage: $0 signal|scheduler /path/to/h5ddp-train [/path/to/h5ddp-ckpt]"
mode=${1:?$usage}
train=${2:?$usage}
ckpt_tool=${3:-}
case "$mode" in signal | scheduler) ;; *) echo "$usage" >&2; exit 1 ;; esac
python=${H5DDP_PYTHON:-/usr/bin/python3}
[ -x "$train" ] || { echo "FAIL: $train is not an executable" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: a private slurmd must run as root"
  exit 77
fi
for prog in munged slurmctld slurmd sbatch scontrol scancel mpirun; do
  command -v "$prog" >/dev/null || { echo "FAIL: $prog missing: apt-get install slurm-wlm munge openmpi-bin" >&2; exit 1; }
done

# Root is required above; mpirun refuses root without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

readonly kMaxSteps=60
readonly kEvery=10
final_name=$(printf 'ckpt-%08d.h5' "$kMaxSteps")
# Small and throttled so that the preemption lands mid-run; --keep-last 0 keeps every checkpoint.
train_args="--epochs 1 --max-steps $kMaxSteps --checkpoint-every-steps $kEvery --step-sleep-ms 100 --seed 7
  --batch-size 64 --model mlp --mlp-hidden 64 --keep-last 0 --no-eval --no-fsync --threads 1"

work=$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-slurm-preempt-$mode.XXXXXX")
chmod 755 "$work"
cluster="$work/cluster"
status=1
ref_pid=""
finish() {
  if [ -n "$ref_pid" ] && kill -0 "$ref_pid" 2>/dev/null; then kill -TERM "$ref_pid" 2>/dev/null || true; fi
  "$here/local_slurm.sh" stop "$cluster" || true
  if [ "$status" -eq 0 ]; then rm -rf "$work"; else echo "logs kept in $work" >&2; fi
}
trap finish EXIT

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
now() { date -u +%T; }

if [ "$mode" = scheduler ]; then
  "$here/local_slurm.sh" start "$cluster" 4 preempt
else
  "$here/local_slurm.sh" start "$cluster" 4
fi
eval "$("$here/local_slurm.sh" env "$cluster")"

job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }

# ---- 1. submit -------------------------------------------------------------------------------------
job_run="$work/job-run"
ref_run="$work/ref-run"
export H5DDP_TRAIN="$train" H5DDP_RUN_DIR="$job_run" H5DDP_TRAIN_ARGS="$train_args"
jid=$(sbatch --parsable --chdir="$work" --job-name=h5ddp-preempt --nodes=1 --ntasks-per-node=2 \
  --output="$work/job-%j.out" "$source_dir/jobs/train.sbatch")
job_out="$work/job-$jid.out"
echo "$(now) submitted job $jid"

# ---- 2. preempt once the first checkpoint is committed ----------------------------------------------
for _ in $(seq 1 900); do
  [ -s "$job_run/latest" ] && break
  state=$(job_field "$jid" JobState)
  case "$state" in PENDING | CONFIGURING | RUNNING) ;; *)
    cat "$job_out" >&2 || true
    echo "FAIL: job $jid is $state before its first checkpoint" >&2
    exit 1
    ;;
  esac
  sleep 0.1
done
[ -s "$job_run/latest" ] || { cat "$job_out" >&2; echo "FAIL: no checkpoint after 90 s" >&2; exit 1; }
echo "$(now) first checkpoint: $(cat "$job_run/latest"); preempting job $jid ($mode)"
high_jid=""
if [ "$mode" = signal ]; then
  scancel --signal=USR1 --batch "$jid"
else
  # All 4 CPUs in the high partition: the 2-task job in the low (default) partition must make room.
  high_jid=$(sbatch --parsable --chdir="$work" --partition=high --ntasks=4 --job-name=h5ddp-high \
    --output="$work/high-%j.out" --wrap "echo high-priority job ran; sleep 2")
fi

# The uninterrupted reference runs while the job waits to be requeued (cred_expire ~10 s).
env -u SLURM_CONF -u H5DDP_LOCAL_SLURM timeout 240 mpirun -np 2 --oversubscribe "$train" --run-dir "$ref_run" \
  --resume auto $train_args >"$work/ref.out" 2>&1 &
ref_pid=$!

# ---- 3. the job saves, requeues, resumes and completes ----------------------------------------------
state=""
for _ in $(seq 1 240); do
  state=$(job_field "$jid" JobState)
  case "$state" in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) break ;;
  esac
  sleep 1
done
echo "$(now) job $jid: $state, restarts $(job_field "$jid" Restarts), exit code $(job_field "$jid" ExitCode)"
ref_rc=0
wait "$ref_pid" || ref_rc=$?
ref_pid=""
echo "--- job output ---"
cat "$job_out"
echo "------------------"

[ "$state" = COMPLETED ] || fail "job ended $state, expected COMPLETED"
[ "$(job_field "$jid" ExitCode)" = "0:0" ] || fail "job exit code $(job_field "$jid" ExitCode)"
[ "$(job_field "$jid" Restarts)" = 1 ] || fail "job restarted $(job_field "$jid" Restarts) times, expected 1"
if [ -n "$high_jid" ]; then
  [ "$(job_field "$high_jid" JobState)" = COMPLETED ] ||
    fail "the preempting job $high_jid is $(job_field "$high_jid" JobState), expected COMPLETED"
fi
grep -q "SLURM_RESTART_COUNT=0 " "$job_out" || fail "no first run (SLURM_RESTART_COUNT=0) in the output"
grep -q "SLURM_RESTART_COUNT=1 " "$job_out" || fail "no requeued run (SLURM_RESTART_COUNT=1) in the output"
grep -q "training step exited with 75" "$job_out" || fail "the preempted step did not exit with 75"
grep -q "requeueing job $jid" "$job_out" || fail "the job script did not requeue on 75"
grep -q "training step exited with 0" "$job_out" || fail "the requeued step did not complete"
resumed=$(grep -o "resumed from [^ ]* at step [0-9]*" "$job_out" | head -1 | sed 's/.* at step //' || true)
if [ -z "$resumed" ]; then
  fail "no 'resumed from <checkpoint> at step N' in the output"
else
  # Saved on the signal: mid-run, at or after the first periodic checkpoint.
  { [ "$resumed" -ge "$kEvery" ] && [ "$resumed" -lt "$kMaxSteps" ]; } ||
    fail "resumed from step $resumed, expected in [$kEvery, $kMaxSteps)"
fi
[ "$ref_rc" -eq 0 ] || { cat "$work/ref.out" >&2; fail "reference run exited $ref_rc"; }

# ---- 4. final checkpoints equal, tensor by tensor --------------------------------------------------
# same A B -> 0 equal, 1 differ, other: could not compare
same() {
  if [ -n "$ckpt_tool" ]; then
    "$ckpt_tool" diff "$1" "$2"
  else
    "$python" - "$1" "$2" <<'EOF'
import sys
import h5py
import numpy as np

def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, (obj.dtype.str, obj.shape, obj[()].tobytes()))
                     if isinstance(obj, h5py.Dataset) else None)
    return out

a, b = datasets(sys.argv[1]), datasets(sys.argv[2])
bad = sorted(set(a) ^ set(b)) + sorted(n for n in set(a) & set(b) if a[n] != b[n])
for n in bad[:20]:
    print("differs:", n)
sys.exit(1 if bad else 0)
EOF
  fi
}

if [ -f "$job_run/$final_name" ] && [ -f "$ref_run/$final_name" ]; then
  rc=0
  same "$ref_run/$final_name" "$job_run/$final_name" >"$work/diff.out" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "ok: $final_name of the preempted job equals the uninterrupted run's"
  else
    cat "$work/diff.out" >&2
    fail "$final_name differs from the uninterrupted run's (compare exit $rc)"
  fi
  # The comparison must be able to fail: the resumed-from checkpoint is an earlier state.
  if [ -n "$resumed" ]; then
    early=$(printf '%s/ckpt-%08d.h5' "$job_run" "$resumed")
    rc=0
    same "$early" "$ref_run/$final_name" >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 1 ] || fail "comparing step $resumed with step $kMaxSteps gave $rc, expected 1 (differ)"
  fi
else
  ls -l "$job_run" "$ref_run" >&2 || true
  fail "missing $final_name in $job_run or $ref_run"
fi

if [ "$failures" -eq 0 ]; then
  status=0
  echo "PASS ($mode): preempted, saved, requeued (SLURM_RESTART_COUNT=1), resumed from step $resumed, completed," \
    "final checkpoint equal to the uninterrupted run's"
fi
exit "$status"

#!/usr/bin/env bash
# Preemption on a real (private, one-node) Slurm, end to end, both ways a job gets preempted:
#   1. submit jobs/train.sbatch with 2 tasks and a short, throttled run (partition `low`);
#   2. once its first periodic checkpoint is committed, signal it the way `--signal=B:USR1@T` does before a
#      time limit: `scancel --signal=USR1 --batch`. The job must save, exit 75, requeue itself, start again
#      with SLURM_RESTART_COUNT=1 and resume from the checkpoint it saved;
#   3. once the resumed job commits a newer checkpoint, preempt it by the scheduler: a job in the
#      higher-priority partition `high` needs all CPUs (PreemptMode=REQUEUE: Slurm sends the job's
#      --signal at once and requeues it). Again: save, exit 75, restart (SLURM_RESTART_COUNT=2), resume;
#   4. the job completes, and its final checkpoint equals, tensor by tensor, that of an uninterrupted
#      `mpirun -np 2` run with the same options (h5ddp-ckpt diff; h5py when the tool is not built).
# Every daemon is stopped by PID on exit, also on failure (local_slurm.sh stop in an EXIT trap).
# With H5DDP_SLURM_NODES=2 (issue 22) the same runs on a two-node Slurm over network namespaces
# (tests/cluster/cluster.sh): `sbatch --nodes=2 --ntasks-per-node=2`, each node with 2 CPUs, the reference is
# `mpirun -np 4`; the cluster's namespaces are removed by PID at exit as well.
#   usage: preempt_test.sh /path/to/h5ddp-train [/path/to/h5ddp-ckpt]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
train=${1:?usage: $0 /path/to/h5ddp-train [/path/to/h5ddp-ckpt]}
ckpt_tool=${2:-}
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
# Small and throttled so that both preemptions land mid-run; --keep-last 0 keeps every checkpoint.
train_args="--epochs 1 --max-steps $kMaxSteps --checkpoint-every-steps $kEvery --step-sleep-ms 100 --seed 7
  --batch-size 64 --model mlp --mlp-hidden 64 --keep-last 0 --no-eval --no-fsync --threads 1"

work=$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-slurm-preempt.XXXXXX")
chmod 755 "$work"
cluster="$work/cluster"
status=1
ref_pid=""
nodes=${H5DDP_SLURM_NODES:-1}
[ "$nodes" = 1 ] || [ "$nodes" = 2 ] || { echo "FAIL: H5DDP_SLURM_NODES must be 1 or 2" >&2; exit 1; }
ranks=$((2 * nodes))
finish() {
  if [ -n "$ref_pid" ] && kill -0 "$ref_pid" 2>/dev/null; then kill -TERM "$ref_pid" 2>/dev/null || true; fi
  "$here/local_slurm.sh" stop "$cluster" || true
  [ "$nodes" = 1 ] || "$here/../cluster/cluster.sh" stop "$work/nodes" || true
  keep_logs_on_failure
}
trap finish EXIT

# shellcheck source=test_lib.sh
. "$here/test_lib.sh"
now() { date -u +%T; }

if [ "$nodes" = 1 ]; then
  "$here/local_slurm.sh" start "$cluster" 4 preempt
else
  "$here/../cluster/cluster.sh" start "$work/nodes" "$nodes"
  H5DDP_CLUSTER_DIR="$work/nodes" "$here/local_slurm.sh" start "$cluster" 2 preempt
  # slurmctld listens on node0 only: the clients run there.
  for c in sbatch scontrol scancel squeue; do
    eval "$c() { \"\$here/local_slurm.sh\" client \"\$cluster\" $c \"\$@\"; }"
  done
fi
eval "$("$here/local_slurm.sh" env "$cluster")"

job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }

job_run="$work/job-run"
ref_run="$work/ref-run"

# Step of the checkpoint `latest` names (empty before the first one).
latest_step() {
  local name
  name=$(cat "$job_run/latest" 2>/dev/null) || return 0
  name=${name#ckpt-}
  name=${name%.h5}
  [ -n "$name" ] && echo $((10#$name))
  return 0
}

# Waits (up to 120 s) until the job has committed a checkpoint newer than step $1; exits on a job that ended.
wait_checkpoint_after() {
  local after=$1 s state
  for _ in $(seq 1 1200); do
    s=$(latest_step)
    if [ -n "$s" ] && [ "$s" -gt "$after" ]; then return 0; fi
    state=$(job_field "$jid" JobState)
    case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
      cat "$job_out" >&2 || true
      echo "FAIL: job $jid ended ($state) before a checkpoint after step $after" >&2
      exit 1
      ;;
    esac
    sleep 0.1
  done
  cat "$job_out" >&2 || true
  echo "FAIL: no checkpoint after step $after within 120 s" >&2
  exit 1
}

# ---- 0. (two nodes) discovery under srun --mpi=pmix: rank r on node r/2, local rank r%2 -------------------
if [ "$nodes" = 2 ]; then
  env_bin="$(dirname "$train")/h5ddp-env"
  timeout 60 "$here/local_slurm.sh" client "$cluster" srun -N 2 -n 4 --mpi=pmix "$env_bin" >"$work/srun-env.out" 2>&1 || fail "srun -N 2 -n 4 exited $?"
  for r in 0 1 2 3; do
    want="rank=$r size=4 local_rank=$((r % 2)) local_size=2 nodes=2 host=node$((r / 2)) slurm_job_id=[0-9]+ \
slurm_procid=$r slurm_localid=$((r % 2)) slurm_ntasks=4 "
    grep -qE "^$want" "$work/srun-env.out" || fail "srun discovery, rank $r: no line '$want' in: $(cat "$work/srun-env.out")"
  done
  [ "$failures" -eq 0 ] && echo "ok: srun -N 2 -n 4 --mpi=pmix: rank, local rank, node count and host right on every rank"
fi

# ---- 1. submit -------------------------------------------------------------------------------------
export H5DDP_TRAIN="$train" H5DDP_RUN_DIR="$job_run" H5DDP_TRAIN_ARGS="$train_args"
jid=$(sbatch --parsable --chdir="$work" --job-name=h5ddp-preempt --nodes="$nodes" --ntasks-per-node=2 \
  --output="$work/job-%j.out" "$source_dir/jobs/train.sbatch")
job_out="$work/job-$jid.out"
echo "$(now) submitted job $jid"

# ---- 2. first preemption: USR1 to the batch shell -----------------------------------------------------
wait_checkpoint_after 0
echo "$(now) checkpoint $(latest_step) committed; preempting job $jid: scancel --signal=USR1 --batch"
scancel --signal=USR1 --batch "$jid"

# The uninterrupted reference runs while the job waits to be requeued (~8 s, cred_expire=5).
env -u SLURM_CONF -u H5DDP_LOCAL_SLURM timeout 300 mpirun -np "$ranks" --oversubscribe "$train" --run-dir "$ref_run" \
  --resume auto $train_args >"$work/ref.out" 2>&1 &
ref_pid=$!

# ---- 3. second preemption: a higher-priority job takes the CPUs ---------------------------------------
for _ in $(seq 1 1200); do
  [ "$(job_field "$jid" Restarts)" = 1 ] && break
  sleep 0.1
done
[ "$(job_field "$jid" Restarts)" = 1 ] || fail "job not requeued 120 s after USR1"
# A checkpoint newer than the one the restarted job resumed from: it runs again.
first_saved=$(latest_step)
wait_checkpoint_after "$first_saved"
echo "$(now) checkpoint $(latest_step) committed after the restart; submitting a job to partition high"
high_jid=$(sbatch --parsable --chdir="$work" --partition=high --ntasks=4 --job-name=h5ddp-high \
  --output="$work/high-%j.out" --wrap "echo high-priority job ran; sleep 2")

# ---- 4. the job completes --------------------------------------------------------------------------
state=""
for _ in $(seq 1 240); do
  state=$(job_field "$jid" JobState)
  case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;; esac
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
[ "$(job_field "$jid" Restarts)" = 2 ] || fail "job restarted $(job_field "$jid" Restarts) times, expected 2"
[ "$(job_field "$high_jid" JobState)" = COMPLETED ] ||
  fail "the preempting job $high_jid is $(job_field "$high_jid" JobState), expected COMPLETED"
for n in 0 1 2; do
  grep -q "SLURM_RESTART_COUNT=$n " "$job_out" || fail "no run with SLURM_RESTART_COUNT=$n in the output"
done
[ "$(grep -c "nodes=$nodes ntasks=$ranks " "$job_out")" -eq 3 ] || fail "expected 3 runs on $nodes node(s) x 2 tasks"
[ "$(grep -c "training step exited with 75" "$job_out")" -eq 2 ] || fail "expected 2 steps to exit with 75"
[ "$(grep -c "requeueing job $jid" "$job_out")" -eq 2 ] || fail "expected the job script to requeue twice"
grep -q "training step exited with 0" "$job_out" || fail "the last run did not complete"
mapfile -t resumed < <(grep -o "resumed from [^ ]* at step [0-9]*" "$job_out" | sed 's/.* at step //')
if [ "${#resumed[@]}" -ne 2 ]; then
  fail "expected 2 'resumed from <checkpoint> at step N' lines, found ${#resumed[@]}"
else
  # Each resume starts from the checkpoint saved on the signal: mid-run, later than the one before.
  { [ "${resumed[0]}" -ge "$kEvery" ] && [ "${resumed[1]}" -gt "${resumed[0]}" ] &&
    [ "${resumed[1]}" -lt "$kMaxSteps" ]; } ||
    fail "resumed at steps ${resumed[*]}, expected $kEvery <= first < second < $kMaxSteps"
fi
[ "$ref_rc" -eq 0 ] || { cat "$work/ref.out" >&2; fail "reference run exited $ref_rc"; }

# ---- 5. final checkpoints equal, tensor by tensor --------------------------------------------------
# same A B -> 0 equal, 1 differ, other: could not compare
same() {
  if [ -n "$ckpt_tool" ]; then
    "$ckpt_tool" diff "$1" "$2"
  else
    "$python" "$here/../support/h5ddp_test.py" compare --datasets-only "$1" "$2"
  fi
}

if [ -f "$job_run/$final_name" ] && [ -f "$ref_run/$final_name" ]; then
  rc=0
  same "$ref_run/$final_name" "$job_run/$final_name" >"$work/diff.out" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "ok: $final_name of the twice-preempted job equals the uninterrupted run's"
  else
    cat "$work/diff.out" >&2
    fail "$final_name differs from the uninterrupted run's (compare exit $rc)"
  fi
  # The comparison must be able to fail: a resumed-from checkpoint holds an earlier state.
  if [ "${#resumed[@]}" -ge 1 ]; then
    early=$(printf '%s/ckpt-%08d.h5' "$job_run" "${resumed[0]}")
    rc=0
    same "$early" "$ref_run/$final_name" >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 1 ] || fail "comparing step ${resumed[0]} with step $kMaxSteps gave $rc, expected 1 (differ)"
  fi
else
  ls -l "$job_run" "$ref_run" >&2 || true
  fail "missing $final_name in $job_run or $ref_run"
fi

if [ "$failures" -eq 0 ]; then
  status=0
  echo "PASS: $nodes node(s) x 2 ranks: preempted by USR1 and by the scheduler, saved, requeued (SLURM_RESTART_COUNT=1, 2), resumed" \
    "at steps ${resumed[*]}, completed; final checkpoint equal to the uninterrupted run's"
fi
exit "$status"

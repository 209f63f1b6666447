#!/usr/bin/env bash
# Rank and local-rank discovery on a real (private, one-node) Slurm: h5ddp-env run
#   1. by `srun -n 2 --mpi=pmix` and `srun -n 4 --mpi=pmix` (what jobs/train.sbatch does),
#   2. by `srun --mpi=pmix` inside an `sbatch -n 2` batch script,
#   3. by `mpirun -np 2` inside an `sbatch -n 2` batch script (there every rank sees SLURM_PROCID=0, which is
#      why h5ddp takes rank and local rank from MPI, never from Slurm's variables).
# Each rank's MPI view (rank, size, local rank, local size, nodes) must be right, and under srun it must
# match SLURM_PROCID/SLURM_LOCALID. With --mpirun-only: just `mpirun -np 1|2|4`, no Slurm (needs no root).
#   usage: discovery_test.sh [--mpirun-only] /path/to/h5ddp-env
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mpirun_only=0
if [ "${1:-}" = --mpirun-only ]; then
  mpirun_only=1
  shift
fi
env_bin=${1:?usage: $0 [--mpirun-only] /path/to/h5ddp-env}
[ -x "$env_bin" ] || { echo "FAIL: $env_bin is not an executable" >&2; exit 1; }

# shellcheck source=test_lib.sh
. "$here/test_lib.sh"

# check_lines WHAT FILE NP MODE: NP lines, line i is rank i with local rank i on one node.
# MODE "srun": SLURM_PROCID/LOCALID equal the MPI rank; "mpirun": inside a Slurm job, whatever its
# variables say; "plain": no Slurm job at all.
check_lines() {
  local what=$1 file=$2 np=$3 mode=$4 i line n before=$failures
  n=$(grep -c '^rank=' "$file" || true)
  [ "$n" -eq "$np" ] || { fail "$what: $n rank lines, expected $np: $(cat "$file")"; return; }
  for ((i = 0; i < np; i++)); do
    line=$(grep "^rank=$i " "$file" || true)
    [ -n "$line" ] || { fail "$what: no line for rank $i"; continue; }
    [ "$(field "$line" size)" = "$np" ] || fail "$what: rank $i: size $(field "$line" size) != $np"
    [ "$(field "$line" local_rank)" = "$i" ] || fail "$what: rank $i: local_rank $(field "$line" local_rank) != $i"
    [ "$(field "$line" local_size)" = "$np" ] || fail "$what: rank $i: local_size $(field "$line" local_size)"
    [ "$(field "$line" nodes)" = 1 ] || fail "$what: rank $i: nodes $(field "$line" nodes) != 1"
    if [ "$mode" = plain ]; then
      [ "$(field "$line" slurm_job_id)" = - ] || fail "$what: rank $i: inside Slurm job $(field "$line" slurm_job_id)"
    else
      [ "$(field "$line" slurm_job_id)" != - ] || fail "$what: rank $i: not inside a Slurm job"
    fi
    if [ "$mode" = srun ]; then
      [ "$(field "$line" slurm_procid)" = "$i" ] || fail "$what: rank $i: SLURM_PROCID $(field "$line" slurm_procid)"
      [ "$(field "$line" slurm_localid)" = "$i" ] || fail "$what: rank $i: SLURM_LOCALID $(field "$line" slurm_localid)"
    fi
  done
  [ "$failures" -ne "$before" ] || echo "ok: $what"
}

if [ "$mpirun_only" -eq 1 ]; then
  out=$(mktemp)
  trap 'rm -f "$out"' EXIT
  for np in 1 2 4; do
    env -u SLURM_JOB_ID -u SLURM_JOBID timeout 60 mpirun -np "$np" --oversubscribe "$env_bin" >"$out" 2>&1 ||
      fail "mpirun -np $np exited $?"
    check_lines "mpirun -np $np" "$out" "$np" plain
  done
  [ "$failures" -eq 0 ] && echo "PASS: discovery under mpirun"
  exit $((failures > 0))
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: a private slurmd must run as root"
  exit 77
fi
for prog in munged slurmctld slurmd srun sbatch; do
  command -v "$prog" >/dev/null || { echo "FAIL: $prog missing: apt-get install slurm-wlm munge" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-slurm-discovery.XXXXXX")
cluster="$work/cluster"
status=1
finish() {
  "$here/local_slurm.sh" stop "$cluster" || true
  if [ "$status" -eq 0 ]; then rm -rf "$work"; else echo "logs kept in $work" >&2; fi
}
trap finish EXIT
"$here/local_slurm.sh" start "$cluster" 4
eval "$("$here/local_slurm.sh" env "$cluster")"

for np in 2 4; do
  timeout 60 srun -n "$np" --mpi=pmix "$env_bin" >"$work/srun$np.out" 2>&1 || fail "srun -n $np exited $?"
  check_lines "srun -n $np --mpi=pmix" "$work/srun$np.out" "$np" srun
done

cat >"$work/srun.sbatch" <<EOF
#!/bin/bash
srun --mpi=pmix "$env_bin"
EOF
cat >"$work/mpirun.sbatch" <<EOF
#!/bin/bash
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 2 --oversubscribe "$env_bin"
EOF
for kind in srun mpirun; do
  timeout 60 sbatch --wait -n 2 -o "$work/sbatch-$kind.out" "$work/$kind.sbatch" >/dev/null ||
    fail "sbatch -n 2 with $kind inside exited $?"
  check_lines "sbatch -n 2 + $kind" "$work/sbatch-$kind.out" 2 "$kind"
done
# What makes Slurm's variables unusable under mpirun: all ranks report SLURM_PROCID=0.
if [ "$(grep -c 'slurm_procid=0 ' "$work/sbatch-mpirun.out" || true)" -ne 2 ]; then
  echo "note: mpirun inside sbatch now passes distinct SLURM_PROCID values" >&2
fi

if [ "$failures" -eq 0 ]; then
  status=0
  echo "PASS: discovery under srun --mpi=pmix and mpirun inside sbatch"
fi
exit "$status"

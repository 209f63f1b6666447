#!/bin/bash
# Data-parallel training with h5ddp on one machine without Slurm: mpirun with N ranks, same run-directory
# and resume conventions as jobs/train.sbatch. Stop it with Ctrl-C, `kill -USR1` or `kill -TERM` of this
# script: every rank saves a checkpoint and the script exits 75; run the same command again to resume
# from it (h5ddp-train's default --resume auto). Another signal 3 s or more later stops at once, without
# saving: the script then exits 128 + that signal's number (130 for a second Ctrl-C).
#
#   jobs/train-local.sh [h5ddp-train options...]          e.g. jobs/train-local.sh --epochs 3
# Each option is taken from the first of: the command line (this script's arguments, then H5DDP_TRAIN_ARGS),
# a --config FILE, the H5DDP_* variables below, the defaults. The script adds only --run-dir, and only when
# neither the command line nor the config file names one.
# Environment (all optional):
#   H5DDP_NP          number of ranks                        default 2
#   H5DDP_RUN_DIR     checkpoints and `latest`               default runs/default (in the working directory)
#   H5DDP_TRAIN       the h5ddp-train binary                 default build/tools/h5ddp-train of this script's tree
#   H5DDP_TRAIN_ARGS  extra options (word-split), before this script's own arguments
#   H5DDP_MPIRUN_ARGS extra mpirun options (word-split), e.g. "--bind-to none"
# As root it allows mpirun to run as root; with more ranks than cores it adds --oversubscribe. mpirun runs with
# --quiet: a rank's own error line is the message (Open MPI's "job aborted" block would bury it).
# Exit code: h5ddp-train's; 75 means "checkpoint saved after a stop signal, run again to resume".
set -uo pipefail

tree=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
np=${H5DDP_NP:-2}
build=${H5DDP_BUILD_DIR:-build}
[[ $build == /* ]] || build=$tree/$build
train=${H5DDP_TRAIN:-$build/tools/h5ddp-train}
if [ ! -x "$train" ]; then
  echo "train-local.sh: $train is not an executable: build first ($tree/tools/setup.sh) or set H5DDP_TRAIN" >&2
  exit 2
fi

# shellcheck disable=SC2206 # H5DDP_TRAIN_ARGS is an option list meant to be word-split
user_args=(${H5DDP_TRAIN_ARGS:-} "$@")

# shellcheck source=jobs/options.sh
source "$tree/jobs/options.sh"
resolve_run_dir "${H5DDP_RUN_DIR:-runs/default}" "${user_args[@]}"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# mpirun runs in its own session (setsid), so signals meant for this script or its process group (Ctrl-C,
# `timeout`, a batch system's kill of the group) reach the ranks only as this script forwards them:
# as USR1, which Open MPI's mpirun relays to every rank (save, exit 75). A signal that comes 3 s or more
# after the first is forwarded as TERM, on which mpirun ends the job without saving; sooner ones are
# duplicates (GNU timeout, for one, signals both its child and its process group). The launcher runs in
# the background because bash runs traps only after the foreground command ends.
launcher_pid=""
first_signal_time=""
stop_code=""
forward() {
  [ -n "$launcher_pid" ] || return 0
  local now
  now=$(date +%s)
  if [ -z "$first_signal_time" ]; then
    first_signal_time=$now
    echo "train-local.sh: got SIG$1, asking every rank to save (signal again to stop without saving)" >&2
    kill -s USR1 "$launcher_pid" 2>/dev/null
  elif [ -z "$stop_code" ] && [ $((now - first_signal_time)) -ge 3 ]; then
    stop_code=$((128 + $(kill -l "$1")))
    echo "train-local.sh: got SIG$1 again, stopping without saving" >&2
    kill -s TERM "$launcher_pid" 2>/dev/null
  fi
  return 0
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
trap 'forward INT' INT

mpirun_args=(--quiet)
if [ "$np" -gt "$(nproc)" ]; then mpirun_args+=(--oversubscribe); fi

# The line h5ddp-train prints to continue this run: this script as it was called, with the H5DDP_* settings
# it was given, less --resume/--init-from (which would start over or go back to an older step); where the
# config file sets either, --resume auto overrides it.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then printf '%s' "$1"; else printf '%q' "$1"; fi
}
hint=()
for v in H5DDP_NP H5DDP_RUN_DIR H5DDP_BUILD_DIR H5DDP_TRAIN H5DDP_TRAIN_ARGS H5DDP_MPIRUN_ARGS; do
  value=${!v:-}
  # shellcheck disable=SC2086 # word-split as the script itself splits it
  if [ "$v" = H5DDP_TRAIN_ARGS ]; then value=$(without_resume ${value} | paste -sd' '); fi
  if [ -n "$value" ]; then hint+=("$v=$(quote "$value")"); fi
done
hint+=("$(quote "$0")")
while IFS= read -r a; do hint+=("$(quote "$a")"); done < <(without_resume "$@")
if [ -n "$config" ] && [ -n "$(config_value resume "$config")$(config_value init-from "$config")" ]; then
  hint+=(--resume auto)
fi
export H5DDP_RESUME_HINT="${hint[*]}"

# shellcheck disable=SC2086 # the *_ARGS variables are option lists meant to be word-split
setsid mpirun -np "$np" "${mpirun_args[@]}" ${H5DDP_MPIRUN_ARGS:-} "$train" "${dir_args[@]}" "${user_args[@]}" &
launcher_pid=$!
while true; do
  wait "$launcher_pid"
  rc=$?
  if [ "$rc" -gt 128 ] && kill -0 "$launcher_pid" 2>/dev/null; then continue; fi
  break
done
if [ -n "$stop_code" ]; then
  echo "train-local.sh: stopped without saving (mpirun exited $rc); the run dir $run_dir holds the checkpoints committed before" >&2
  exit "$stop_code"
fi
if [ "$rc" -eq 75 ]; then
  echo "train-local.sh: checkpoint saved in $run_dir; run the same command again to resume" >&2
fi
exit "$rc"

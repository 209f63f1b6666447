#!/usr/bin/env bash
# A private one-node Slurm for tests: munged, slurmctld and slurmd from Debian's packages, every address
# 127.0.0.1, every file (config, key, sockets, state, logs, PIDs) inside one directory, fresh ports.
#
#   local_slurm.sh start DIR [CPUS] [preempt]
#                                     start the daemons (DIR is created, must be empty); waits for an idle node.
#                                     One partition `debug`; with `preempt`: partitions `low` (default) and
#                                     `high`, where a `high` job requeues the `low` jobs it needs the CPUs of
#                                     (USR1 to their batch shell at once, TERM after GraceTime=20 s).
#   local_slurm.sh env DIR            print `export ...` lines for clients (eval "$(local_slurm.sh env DIR)")
#   local_slurm.sh stop DIR           cancel all jobs, stop slurmd, slurmctld, munged by recorded PID
#
# Callers install `trap 'local_slurm.sh stop DIR' EXIT` right after start so the daemons go also on failure;
# start itself stops what it started if it fails half way. Nothing is ever stopped by name: only the PIDs
# recorded in DIR/pids, and (last resort) leftovers of this cluster only: slurmstepd processes carrying its
# SLURM_CONF, job processes carrying its marker H5DDP_LOCAL_SLURM=DIR and a SLURM_JOB_ID.
# Measured on Debian 12 (slurm-wlm 22.05, Open MPI 4.1): containers have no cgroups (linuxproc/none
# plugins); Debian's Open MPI needs `srun --mpi=pmix`; munged's socket needs o+x parents; clients need
# SLURM_CONF; start takes ~1 s, stop ~2 s (daemons stopped together, jobs cancelled first).
set -euo pipefail

die() {
  echo "local_slurm: $*" >&2
  exit 1
}

usage() { die "usage: $0 start DIR [CPUS] [preempt] | env DIR | stop DIR"; }

# A TCP port nobody listens on (random, so that concurrent clusters do not collide).
free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if ! ss -Htln "sport = :$p" 2>/dev/null | grep -q .; then
      echo "$p"
      return 0
    fi
  done
  die "no free TCP port found"
}

print_env() {
  local dir=$1
  echo "export SLURM_CONF='$dir/slurm.conf'"
  echo "export H5DDP_LOCAL_SLURM='$dir'"
  # Variables a caller's environment may carry from an outer allocation would confuse our clients.
  echo "unset SLURM_JOB_ID SLURM_JOBID SLURM_STEP_ID SLURM_NODELIST SLURM_NTASKS"
}

# Waits up to $2 seconds (tenths) for `$1` to succeed.
wait_for() {
  local cmd=$1 tenths=$(($2 * 10))
  for _ in $(seq 1 "$tenths"); do
    if eval "$cmd" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  return 1
}

# True while the process exists and is not a zombie waiting for its (re)parent to reap it.
pid_alive() {
  local f
  [ -n "$1" ] && read -r -a f 2>/dev/null <"/proc/$1/stat" && [ "${f[2]}" != Z ]
}

# Sends TERM to recorded PIDs, waits up to 5 s for all of them, then KILLs the rest.
stop_pids() {
  local pid alive
  for pid in "$@"; do pid_alive "$pid" && kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 1 50); do
    alive=""
    for pid in "$@"; do pid_alive "$pid" && alive="$alive $pid"; done
    [ -z "$alive" ] && return 0
    sleep 0.1
  done
  echo "local_slurm: pids$alive ignored TERM, killing" >&2
  for pid in $alive; do kill -KILL "$pid" 2>/dev/null; done
  return 0
}

# Leftover processes of this cluster: slurmstepd with our SLURM_CONF, and job processes whose environment
# holds our marker and a SLURM_JOB_ID; never in our own session (the caller exported the marker too).
marked_pids() {
  local dir=$1 my_sid p f
  read -r -a f <"/proc/$$/stat"
  my_sid=${f[5]}
  for p in /proc/[0-9]*; do
    # Field 6 is the session id (the command name, field 2, has no spaces for the processes we look for).
    read -r -a f 2>/dev/null <"$p/stat" || continue
    [ "${f[5]}" = "$my_sid" ] && continue
    if [ "${f[1]}" = "(slurmstepd)" ]; then
      # slurmstepd keeps only SLURM_CONF from our slurmd's environment.
      grep -qzxF "SLURM_CONF=$dir/slurm.conf" "$p/environ" 2>/dev/null && echo "${p#/proc/}"
    elif grep -qzxF "H5DDP_LOCAL_SLURM=$dir" "$p/environ" 2>/dev/null &&
      grep -qz '^SLURM_JOB_ID=' "$p/environ" 2>/dev/null; then
      echo "${p#/proc/}"
    fi
  done
  return 0
}

cmd_stop() {
  local dir=$1
  [ -f "$dir/pids" ] || return 0
  export SLURM_CONF="$dir/slurm.conf"
  local ctld_pid slurmd_pid munged_pid
  ctld_pid=$(awk '$1 == "slurmctld" {print $2}' "$dir/pids")
  slurmd_pid=$(awk '$1 == "slurmd" {print $2}' "$dir/pids")
  munged_pid=$(awk '$1 == "munged" {print $2}' "$dir/pids")

  # Jobs first: killing slurmd alone leaves slurmstepd and the job's processes running.
  if pid_alive "$ctld_pid" && pid_alive "$slurmd_pid"; then
    timeout 10 scancel --user="$(id -un)" 2>/dev/null || true
    wait_for "[ -z \"\$(squeue -h -t all -o %i 2>/dev/null | head -1)\" ] || \
              ! squeue -h -o %T 2>/dev/null | grep -qE 'RUNNING|COMPLETING|PENDING|CONFIGURING|REQUEUE'" 15 || \
      echo "local_slurm: jobs still present after scancel" >&2
  fi
  # The daemons keep no state we need (the cluster is thrown away): stop them together, not one by one.
  stop_pids "$slurmd_pid" "$ctld_pid" "$munged_pid"

  local left
  left=$(marked_pids "$dir" | tr '\n' ' ')
  if [ -n "${left// /}" ]; then
    echo "local_slurm: killing leftover job processes of this cluster: $left" >&2
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
  fi
  mv "$dir/pids" "$dir/pids.stopped"
}

cmd_start() {
  local dir=$1 cpus=${2:-4} partitions=${3:-}
  mkdir -p "$dir"
  [ -z "$(ls -A "$dir")" ] || die "$dir is not empty"
  dir=$(cd "$dir" && pwd -P)
  # munged's socket must be reachable through o+x directories ("Socket is inaccessible" otherwise).
  chmod 755 "$dir"
  mkdir -p "$dir/munge" "$dir/ctld" "$dir/spool" "$dir/log"
  chmod 700 "$dir/ctld" "$dir/spool"
  chmod 755 "$dir/munge"
  : >"$dir/pids"
  # From here on, a failure stops whatever was started.
  # shellcheck disable=SC2064
  trap "echo 'local_slurm: start failed; logs in $dir/log' >&2; cmd_stop '$dir'" EXIT

  local host node ctld_port slurmd_port
  host=$(hostname)
  node=$(hostname -s)
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  [ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$(free_port)

  # Environment of the daemons: the marker lets `stop` find leftovers of this cluster only.
  export SLURM_CONF="$dir/slurm.conf"
  export H5DDP_LOCAL_SLURM="$dir"

  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$dir/munge/munge.key"
  setsid munged --foreground --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" \
    </dev/null >>"$dir/log/munged.out" 2>&1 &
  echo "munged $!" >>"$dir/pids"
  wait_for "[ -S '$dir/munge/munge.socket' ]" 10 || die "munged did not create its socket (see $dir/log)"

  cat >"$dir/slurm.conf" <<EOF
# Generated by tests/slurm/local_slurm.sh: a private one-node cluster, every file under $dir.
ClusterName=h5ddp${ctld_port}
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmdPort=${slurmd_port}
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire bounds how soon a requeued job may start again (default 120 s): 5 s gives ~8 s, and is the
# least slurmctld 22.05 accepts (3 logs "AuthInfo=cred_expire=3 invalid" and keeps 120).
AuthInfo=socket=${dir}/munge/munge.socket,cred_expire=5
StateSaveLocation=${dir}/ctld
SlurmdSpoolDir=${dir}/spool
SlurmctldPidFile=${dir}/slurmctld.pid
SlurmdPidFile=${dir}/slurmd.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in test containers.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=${dir}/log/jobcomp.txt
MpiDefault=pmix
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Advertise more CPUs than the machine has (2-core CI machines, 4-rank tests).
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=${node} NodeAddr=127.0.0.1 NodeHostname=${host} CPUs=${cpus} State=UNKNOWN
EOF
  if [ "$partitions" = preempt ]; then
    # 22.05 has no PreemptParameters; preempt_send_user_signal sends the job's --signal on preemption.
    cat >>"$dir/slurm.conf" <<EOF
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
PartitionName=low Nodes=${node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=20
PartitionName=high Nodes=${node} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
  else
    echo "PartitionName=debug Nodes=${node} Default=YES MaxTime=INFINITE State=UP" >>"$dir/slurm.conf"
  fi

  setsid slurmctld -D -i -f "$dir/slurm.conf" </dev/null >>"$dir/log/slurmctld.out" 2>&1 &
  echo "slurmctld $!" >>"$dir/pids"
  wait_for "scontrol ping | grep -q UP" 20 || die "slurmctld did not answer (see $dir/log/slurmctld.log)"

  setsid slurmd -D -f "$dir/slurm.conf" -N "$node" </dev/null >>"$dir/log/slurmd.out" 2>&1 &
  echo "slurmd $!" >>"$dir/pids"
  wait_for "sinfo -h -n '$node' -o %t | grep -qx idle" 30 ||
    die "node $node did not become idle: $(sinfo -h -o '%t %E' 2>&1) (see $dir/log/slurmd.log)"
  trap - EXIT
  echo "local_slurm: cluster h5ddp${ctld_port} up in $dir (ports $ctld_port/$slurmd_port, $cpus CPUs)" >&2
}

[ $# -ge 2 ] || usage
case "$1" in
  start) cmd_start "$2" "${3:-4}" "${4:-}" ;;
  env) print_env "$(cd "$2" && pwd -P)" ;;
  stop) cmd_stop "$(cd "$2" && pwd -P)" ;;
  *) usage ;;
esac

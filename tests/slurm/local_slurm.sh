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
#   local_slurm.sh client DIR CMD...  run a client (sbatch, srun, squeue, ...) where it reaches slurmctld
#
# Multi-node (issue 22): with H5DDP_CLUSTER_DIR set to a cluster of tests/cluster/cluster.sh, slurmctld runs
# on node0 and one slurmd on every node (NodeName nodeK, NodeAddr its 10.99.0.x, spool/log/PID per node);
# munged stays in the machine's namespaces (its socket is a file, reachable from every node). Clients must
# run on a node (`client` does that): slurmctld listens on node0's address only.
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

usage() { die "usage: $0 start DIR [CPUS] [preempt] | env DIR | stop DIR | client DIR CMD..."; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

# The cluster (cluster.sh) the daemons of DIR run on; empty for the one-node cluster.
cluster_of() { cat "$1/cluster" 2>/dev/null || true; }

# on_node DIR NODE CMD...: CMD inside NODE's namespaces (multi-node), or here.
on_node() {
  local dir=$1 node=$2 c
  shift 2
  c=$(cluster_of "$dir")
  if [ -n "$c" ]; then
    "$here/../cluster/cluster.sh" exec "$c" "$node" "$@"
  else
    "$@"
  fi
}
client() {
  local dir=$1
  shift
  on_node "$dir" node0 "$@"
}

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
  slurmd_pid=$(awk '$1 == "slurmd" {print $2}' "$dir/pids" | tr '\n' ' ')
  munged_pid=$(awk '$1 == "munged" {print $2}' "$dir/pids")

  # Jobs first: killing slurmd alone leaves slurmstepd and the job's processes running.
  if pid_alive "$ctld_pid" && [ -n "$slurmd_pid" ]; then
    timeout 10 "$here/local_slurm.sh" client "$dir" scancel --user="$(id -un)" 2>/dev/null || true
    wait_for "[ -z \"\$(client '$dir' squeue -h -t all -o %i 2>/dev/null | head -1)\" ] || \
              ! client '$dir' squeue -h -o %T 2>/dev/null | grep -qE 'RUNNING|COMPLETING|PENDING|CONFIGURING|REQUEUE'" 15 || \
      echo "local_slurm: jobs still present after scancel" >&2
  fi
  # The daemons keep no state we need (the cluster is thrown away): stop them together, not one by one.
  # shellcheck disable=SC2086
  stop_pids $slurmd_pid "$ctld_pid" "$munged_pid"

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

  local host node ctld_port slurmd_port ctld_addr nodes_conf node_list c=${H5DDP_CLUSTER_DIR:-}
  if [ -n "$c" ]; then
    c=$(cd "$c" && pwd -P)
    [ -f "$c/nodes" ] || die "H5DDP_CLUSTER_DIR=$c holds no cluster (tests/cluster/cluster.sh start)"
    echo "$c" >"$dir/cluster"
    host=node0
    ctld_addr=$(awk '$1 == "node0" {print $3}' "$c/nodes")
    # Each node advertises CPUS CPUs: a job spans nodes only when it needs more than one node's CPUs.
    nodes_conf=$(awk -v cpus="$cpus" '{printf "NodeName=%s NodeAddr=%s NodeHostname=%s CPUs=%s State=UNKNOWN\n", $1, $3, $1, cpus}' "$c/nodes")
    node_list=$(awk '{printf "%s%s", (NR > 1 ? "," : ""), $1}' "$c/nodes")
  else
    host=$(hostname)
    node=$(hostname -s)
    ctld_addr=127.0.0.1
    nodes_conf="NodeName=${node} NodeAddr=127.0.0.1 NodeHostname=${host} CPUs=${cpus} State=UNKNOWN"
    node_list=$node
  fi
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
SlurmctldHost=${host}(${ctld_addr})
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
SlurmdSpoolDir=${dir}/spool/%n
SlurmctldPidFile=${dir}/slurmctld.pid
SlurmdPidFile=${dir}/slurmd-%n.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in test containers.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
TmpFS=/tmp
DebugFlags=NO_CONF_HASH
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
${nodes_conf}
EOF
  if [ "$partitions" = preempt ]; then
    # 22.05 has no PreemptParameters; preempt_send_user_signal sends the job's --signal on preemption.
    cat >>"$dir/slurm.conf" <<EOF
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
PartitionName=low Nodes=${node_list} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=20
PartitionName=high Nodes=${node_list} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
  else
    echo "PartitionName=debug Nodes=${node_list} Default=YES MaxTime=INFINITE State=UP" >>"$dir/slurm.conf"
  fi

  setsid "$here/local_slurm.sh" on-node "$dir" node0 slurmctld -D -i -f "$dir/slurm.conf" </dev/null \
    >>"$dir/log/slurmctld.out" 2>&1 &
  echo "slurmctld $!" >>"$dir/pids"
  wait_for "client '$dir' scontrol ping | grep -q UP" 20 || die "slurmctld did not answer (see $dir/log/slurmctld.log)"

  local n conf
  for n in ${node_list//,/ }; do
    mkdir -p "$dir/spool/$n" "$dir/tmp/$n"
    chmod 700 "$dir/spool/$n"
    chmod 1777 "$dir/tmp/$n"
    conf="$dir/slurm.conf"
    if [ -n "$c" ]; then
      # The nodes share one /tmp, where Slurm's PMIx plugin makes per-step directories named by job and node
      # index only: each node gets a TmpFS of its own (a real node has its own /tmp). Only this line differs
      # from slurm.conf; NO_CONF_HASH keeps the daemons from warning about it.
      conf="$dir/slurm-$n.conf"
      sed "s|^TmpFS=.*|TmpFS=$dir/tmp/$n|" "$dir/slurm.conf" >"$conf"
    fi
    setsid "$here/local_slurm.sh" on-node "$dir" "$n" slurmd -D -f "$conf" -N "$n" </dev/null \
      >>"$dir/log/slurmd-$n.out" 2>&1 &
    echo "slurmd $!" >>"$dir/pids"
  done
  for n in ${node_list//,/ }; do
    wait_for "client '$dir' sinfo -h -n '$n' -o %t | grep -qx idle" 30 ||
      die "node $n did not become idle: $(client "$dir" sinfo -h -o '%N %t %E' 2>&1) (see $dir/log/slurmd-$n.log)"
  done
  trap - EXIT
  echo "local_slurm: cluster h5ddp${ctld_port} up in $dir (ports $ctld_port/$slurmd_port, $cpus CPUs)" >&2
}

[ $# -ge 2 ] || usage
case "$1" in
  start) cmd_start "$2" "${3:-4}" "${4:-}" ;;
  env) print_env "$(cd "$2" && pwd -P)" ;;
  stop) cmd_stop "$(cd "$2" && pwd -P)" ;;
  client) client "$(cd "$2" && pwd -P)" "${@:3}" ;;
  # internal: exec a daemon on a node, keeping the PID (cluster.sh exec execs nsenter, which execs CMD)
  on-node)
    c=$(cluster_of "$(cd "$2" && pwd -P)")
    if [ -n "$c" ]; then exec "$here/../cluster/cluster.sh" exec "$c" "$3" "${@:4}"; else exec "${@:4}"; fi
    ;;
  *) usage ;;
esac

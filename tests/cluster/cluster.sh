#!/usr/bin/env bash
# A private multi-node cluster on one machine: every node is a pair of Linux network and UTS namespaces
# (its own hostname nodeK and address 10.99.0.(K+1) on eth0), the nodes' eth0 are veth pairs plugged into
# one bridge that lives in a namespace of its own (the "switch"). The file system and the process table are
# the machine's, so the shared file system of a real cluster is simply the same disk. No address is ever
# set outside the namespaces created here; no name is registered (/run/netns stays untouched).
#
#   cluster.sh start DIR N           start N nodes (DIR is created, must be empty); DIR/nodes lists
#                                    "name pid address" per node, DIR/pids every holder process.
#   cluster.sh exec DIR NODE CMD...  run CMD inside NODE's namespaces (network + hostname), same cwd/env
#   cluster.sh rsh                   (as Open MPI's plm_rsh_agent, through DIR/rsh) see `rsh_agent` below
#   cluster.sh hostfile DIR SLOTS    print an Open MPI hostfile: every node with SLOTS slots
#   cluster.sh pids DIR NODE NAME    PIDs of the processes called NAME running inside NODE (one per line)
#   cluster.sh stop DIR              kill every process left inside the nodes, then the holders, by PID
#
# Every namespace is held by one `sleep` process whose PID is recorded; killing it (and whatever
# runs inside) destroys the namespace and its veth ends with it, so `stop` leaves nothing behind, and so
# does a crashed caller once the holders are killed. Callers install `trap 'cluster.sh stop DIR' EXIT`
# right after start; start itself stops what it started when it fails half way.
set -euo pipefail

die() {
  echo "cluster: $*" >&2
  exit 1
}
usage() { die "usage: $0 start DIR N | exec DIR NODE CMD... | hostfile DIR SLOTS | stop DIR"; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

pid_alive() {
  local f
  [ -n "$1" ] && read -r -a f 2>/dev/null <"/proc/$1/stat" && [ "${f[2]}" != Z ]
}

# Starts a holder with fresh network and UTS namespaces and hostname $1; prints its PID.
start_holder() {
  local name=$1
  # setsid: out of the caller's process group (a ^C of the caller must not kill the cluster half way);
  # unshare execs sleep, so $! is the process that holds the namespaces.
  # A bounded sleep: if the caller is killed before its EXIT trap runs (a ctest timeout sends SIGKILL), the
  # holders still end, and with them the namespaces, after H5DDP_CLUSTER_MAX_SECONDS (default 2 hours).
  setsid unshare --net --uts sh -c "hostname '$name' && exec sleep ${H5DDP_CLUSTER_MAX_SECONDS:-7200}" \
    </dev/null >/dev/null 2>&1 &
  local pid=$!
  # Wait until the holder has exec'd sleep (the hostname is set, the namespaces exist).
  for _ in $(seq 1 50); do
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sleep ]; then
      echo "$pid"
      return 0
    fi
    sleep 0.05
  done
  kill -KILL "$pid" 2>/dev/null || true
  die "namespace holder for $name did not start (unshare needs root or CAP_SYS_ADMIN)"
}

in_ns() {
  local pid=$1
  shift
  nsenter -t "$pid" --net --uts -- "$@"
}

# The PIDs of processes inside the namespaces of holder $1 (other than the holder itself).
ns_members() {
  local holder=$1 ns p
  ns=$(readlink "/proc/$holder/ns/net" 2>/dev/null) || return 0
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$holder" ] && continue
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$ns" ] && echo "${p#/proc/}"
  done
  return 0
}

cmd_stop() {
  local dir=$1 pid pids members=""
  [ -f "$dir/pids" ] || return 0
  pids=$(awk '{print $2}' "$dir/pids")
  for pid in $pids; do
    pid_alive "$pid" && members="$members $(ns_members "$pid" | tr '\n' ' ')"
  done
  if [ -n "${members// /}" ]; then
    # shellcheck disable=SC2086
    kill -TERM $members 2>/dev/null || true
    sleep 0.5
    # shellcheck disable=SC2086
    kill -KILL $members 2>/dev/null || true
  fi
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  for _ in $(seq 1 50); do
    local alive=""
    for pid in $pids; do pid_alive "$pid" && alive=1; done
    [ -z "$alive" ] && break
    sleep 0.05
  done
  mv "$dir/pids" "$dir/pids.stopped"
}

cmd_start() {
  local dir=$1 n=$2
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "node count must be 1..200"
  mkdir -p "$dir"
  [ -z "$(ls -A "$dir")" ] || die "$dir is not empty"
  dir=$(cd "$dir" && pwd -P)
  : >"$dir/pids"
  : >"$dir/nodes"
  # shellcheck disable=SC2064
  trap "echo 'cluster: start failed' >&2; cmd_stop '$dir'" EXIT

  local sw k pid addr
  sw=$(start_holder switch)
  echo "switch $sw" >>"$dir/pids"
  in_ns "$sw" ip link add br0 type bridge
  in_ns "$sw" ip link set br0 up
  for k in $(seq 0 $((n - 1))); do
    pid=$(start_holder "node$k")
    echo "node$k $pid" >>"$dir/pids"
    addr="10.99.0.$((k + 1))"
    # The pair is made inside the switch; its other end goes straight into the node as eth0.
    in_ns "$sw" ip link add "port$k" type veth peer name eth0 netns "$pid"
    in_ns "$sw" ip link set "port$k" master br0 up
    in_ns "$pid" ip link set lo up
    in_ns "$pid" ip addr add "$addr/24" dev eth0
    in_ns "$pid" ip link set eth0 up
    echo "node$k $pid $addr" >>"$dir/nodes"
  done
  # node0 reaches the last node before we call the cluster up (no ping here: a TCP connect to a closed
  # port answers "Connection refused" only when the peer is reachable).
  local first out last_addr="10.99.0.$n" reached=""
  first=$(awk 'NR==1 {print $2}' "$dir/nodes")
  for _ in $(seq 1 50); do
    out=$(in_ns "$first" timeout 2 bash -c "exec 3<>/dev/tcp/$last_addr/9" 2>&1 || true)
    if [[ "$out" == *refused* ]]; then
      reached=1
      break
    fi
    sleep 0.1
  done
  [ -n "$reached" ] || die "node0 cannot reach $last_addr: $out"
  # The agent Open MPI calls instead of ssh: it knows this cluster's directory.
  printf '#!/bin/sh\nexec %q rsh %q "$@"\n' "$here/cluster.sh" "$dir" >"$dir/rsh"
  chmod +x "$dir/rsh"
  trap - EXIT
  echo "cluster: $n nodes up in $dir" >&2
}

node_pid() {
  local dir=$1 node=$2 pid
  pid=$(awk -v n="$node" '$1 == n || $3 == n {print $2}' "$dir/nodes")
  [ -n "$pid" ] || die "no node $node in $dir/nodes"
  pid_alive "$pid" || die "node $node (holder $pid) is not running"
  echo "$pid"
}

cmd_exec() {
  local dir=$1 node=$2
  shift 2
  exec nsenter -t "$(node_pid "$dir" "$node")" --net --uts -- "$@"
}

# Open MPI's rsh launcher runs `AGENT [agent options] HOST CMD...` and expects CMD to be run by a shell on
# HOST, as ssh would. We drop ssh-style options (none are passed by default), enter HOST's namespaces and
# run CMD with sh -c; the working directory and the environment are this machine's, as on a shared FS.
rsh_agent() {
  local dir=$1
  shift
  while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
    case "$1" in
      -x | -X | -T | -n | -q) shift ;;
      *) shift 2 ;;
    esac
  done
  [ $# -ge 2 ] || die "rsh: usage: HOST CMD..."
  local node=$1
  shift
  exec nsenter -t "$(node_pid "$dir" "$node")" --net --uts -- sh -c "$*"
}

[ $# -ge 1 ] || usage
case "$1" in
  start) [ $# -eq 3 ] || usage; cmd_start "$2" "$3" ;;
  exec) [ $# -ge 4 ] || usage; cmd_exec "$(cd "$2" && pwd -P)" "$3" "${@:4}" ;;
  rsh) [ $# -ge 2 ] || usage; rsh_agent "${@:2}" ;;
  hostfile)
    [ $# -eq 3 ] || usage
    awk -v s="$3" '{print $1 " slots=" s}' "$2/nodes"
    ;;
  pids)
    [ $# -eq 4 ] || usage
    for p in $(ns_members "$(node_pid "$(cd "$2" && pwd -P)" "$3")"); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$4" ] && echo "$p"
    done
    true
    ;;
  stop) [ $# -eq 2 ] || usage; cmd_stop "$(cd "$2" && pwd -P)" ;;
  *) usage ;;
esac

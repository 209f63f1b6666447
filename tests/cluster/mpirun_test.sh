#!/usr/bin/env bash
# h5ddp across nodes under mpirun (issue 22), on a private cluster of network namespaces (cluster.sh):
#   1. discovery: rank, local rank, local size, node count and host at 2 nodes x 2 ranks and 4 nodes x 1;
#   2. training at 2 nodes x 2 ranks equals 1 node x 4 ranks (dropout 0; bitwise here, where both use the
#      same allreduce algorithm; a tolerance would be the honest bound on another network);
#   3. SIGKILL of node1's ranks after the step-5 checkpoint, resume at 2 x 2: bitwise equal to the
#      uninterrupted 2 x 2 run;
#   4. the 2-node step-5 checkpoint resumes on 1 node (2 ranks, share + exchange load) and the 1-node one on
#      2 nodes x 1 rank (every-rank-reads, O_DIRECT chosen per host: on, each rank alone on its node), both
#      continuing to the uninterrupted result within 1e-5 (another rank count changes the summation order).
# Every namespace and process is removed by PID at exit, also on failure (cluster.sh stop in an EXIT trap).
#   usage: mpirun_test.sh /path/to/h5ddp-train /path/to/h5ddp-env
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
train=${1:?usage: $0 h5ddp-train h5ddp-env}
env_bin=${2:?usage: $0 h5ddp-train h5ddp-env}
python=${H5DDP_PYTHON:-/usr/bin/python3}
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: network namespaces need root"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE

work=$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-cluster-mpirun.XXXXXX")
cluster="$work/cluster"
status=1
# shellcheck source=../slurm/test_lib.sh
. "$here/../slurm/test_lib.sh"
finish() {
  "$here/cluster.sh" stop "$cluster" || true
  keep_logs_on_failure
}
trap finish EXIT

"$here/cluster.sh" start "$cluster" 4
# mpirun runs on node0; orted reaches the other nodes through cluster.sh's agent instead of ssh, and all
# MPI traffic between nodes goes over eth0 (TCP over the veth bridge), as it would over Ethernet.
printf 'node0 slots=2\nnode1 slots=2\n' >"$work/two-nodes"
printf 'node0 slots=1\nnode1 slots=1\n' >"$work/two-nodes-one-slot"
printf 'node0 slots=4\n' >"$work/one-node"
"$here/cluster.sh" hostfile "$cluster" 1 >"$work/four-nodes"
mpi() {
  local hosts=$1 np=$2
  shift 2
  timeout -k 5 180 "$here/cluster.sh" exec "$cluster" node0 mpirun --oversubscribe --hostfile "$work/$hosts" \
    -np "$np" --mca plm_rsh_agent "$cluster/rsh" --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 "$@"
}

# check_discovery OUT NP PER_NODE: rank r is on node r/PER_NODE with local rank r%PER_NODE.
check_discovery() {
  local out=$1 np=$2 per=$3 r line before=$failures
  for ((r = 0; r < np; r++)); do
    line=$(grep "^rank=$r " "$out" || true)
    [ -n "$line" ] || { fail "discovery $np/$per: no line for rank $r: $(cat "$out")"; continue; }
    [ "$(field "$line" size)" = "$np" ] || fail "rank $r: size $(field "$line" size)"
    [ "$(field "$line" local_rank)" = $((r % per)) ] || fail "rank $r: local_rank $(field "$line" local_rank)"
    [ "$(field "$line" local_size)" = "$per" ] || fail "rank $r: local_size $(field "$line" local_size)"
    [ "$(field "$line" nodes)" = $((np / per)) ] || fail "rank $r: nodes $(field "$line" nodes)"
    [ "$(field "$line" host)" = "node$((r / per))" ] || fail "rank $r: host $(field "$line" host)"
  done
  [ "$failures" -ne "$before" ] || echo "ok: discovery at $((np / per)) nodes x $per ranks"
}
mpi two-nodes 4 "$env_bin" >"$work/env-2x2.out" 2>&1 || fail "h5ddp-env at 2 x 2 exited $?: $(cat "$work/env-2x2.out")"
check_discovery "$work/env-2x2.out" 4 2
mpi four-nodes 4 "$env_bin" >"$work/env-4x1.out" 2>&1 || fail "h5ddp-env at 4 x 1 exited $?: $(cat "$work/env-4x1.out")"
check_discovery "$work/env-4x1.out" 4 1

args=(--model mlp --mlp-hidden 64 --dropout 0 --batch-size 64 --max-steps 12 --seed 11 --optimizer adam
  --checkpoint-every-steps 5 --keep-last 0 --no-eval --no-fsync --no-metrics --log-every 1 --threads 1)
final=ckpt-00000012.h5
compare() { "$python" "$source_dir/tests/support/h5ddp_test.py" compare "$@"; }

mpi one-node 4 "$train" "${args[@]}" --run-dir "$work/a" >"$work/a.log" 2>&1 || fail "1 x 4 run: $(tail -5 "$work/a.log")"
mpi two-nodes 4 "$train" "${args[@]}" --run-dir "$work/b" >"$work/b.log" 2>&1 || fail "2 x 2 run: $(tail -5 "$work/b.log")"
if compare "$work/a/$final" "$work/b/$final" >"$work/ab.cmp" 2>&1; then
  echo "ok: 2 nodes x 2 ranks == 1 node x 4 ranks, bitwise"
else
  fail "2 x 2 differs from 1 x 4: $(tail -5 "$work/ab.cmp")"
fi

# SIGKILL of every rank of node1 once the step-5 checkpoint is committed (throttled run), then resume.
mpi two-nodes 4 "$train" "${args[@]}" --run-dir "$work/c" --step-sleep-ms 400 >"$work/c1.log" 2>&1 &
job=$!
# node1's two ranks are looked up while the job starts: `cluster.sh pids` scans /proc, which takes seconds on a
# loaded machine, longer than the run needs from the step-5 to the step-10 checkpoint. The kill then follows the
# step-5 commit within one poll.
victims=""
for _ in $(seq 1 1200); do
  victims=$("$here/cluster.sh" pids "$cluster" node1 h5ddp-train | tr '\n' ' ')
  [ "$(wc -w <<<"$victims")" -ge 2 ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.05
done
for _ in $(seq 1 1200); do
  [ "$(cat "$work/c/latest" 2>/dev/null)" = ckpt-00000005.h5 ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.05
done
if [ "$(cat "$work/c/latest" 2>/dev/null)" != ckpt-00000005.h5 ] || [ -z "${victims// /}" ]; then
  fail "no step-5 checkpoint or no ranks on node1 to kill: $(tail -5 "$work/c1.log")"
else
  # shellcheck disable=SC2086
  kill -KILL $victims
  rc=0
  wait "$job" || rc=$?
  [ "$rc" -ne 0 ] || fail "the job with node1's ranks killed exited 0"
  [ ! -f "$work/c/$final" ] || fail "the interrupted run finished before node1's ranks were killed"
  mpi two-nodes 4 "$train" "${args[@]}" --run-dir "$work/c" >"$work/c2.log" 2>&1 || fail "resume: $(tail -5 "$work/c2.log")"
  grep -q "resumed from .*ckpt-00000005.h5 at step 5" "$work/c2.log" || fail "did not resume from step 5: $(tail -5 "$work/c2.log")"
  if compare "$work/b/$final" "$work/c/$final" >"$work/bc.cmp" 2>&1; then
    echo "ok: node1's ranks SIGKILLed, resumed at 2 x 2: bitwise equal to the uninterrupted run"
  else
    fail "resumed run differs: $(tail -5 "$work/bc.cmp")"
  fi
fi

# Across topologies: the 2-node checkpoint on 1 node x 2 ranks (share + exchange), the 1-node checkpoint on
# 2 nodes x 1 rank (every-rank-reads; O_DIRECT on, each rank being alone on its host).
printf 'node0 slots=2\n' >"$work/one-node-two"
mpi one-node-two 2 "$train" "${args[@]}" --run-dir "$work/d" --resume "$work/b/ckpt-00000005.h5" \
  --load-strategy share-exchange >"$work/d.log" 2>&1 || fail "2-node checkpoint on 1 node: $(tail -5 "$work/d.log")"
mpi two-nodes-one-slot 2 -x H5DDP_LOG_LEVEL=debug "$train" "${args[@]}" --run-dir "$work/e" \
  --resume "$work/a/ckpt-00000005.h5" >"$work/e.log" 2>&1 || fail "1-node checkpoint on 2 nodes: $(tail -5 "$work/e.log")"
for run in d:b e:a; do
  got=${run%%:*} want=${run##*:}
  grep -q "resumed from .*ckpt-00000005.h5 at step 5" "$work/$got.log" || fail "$got: no resume from step 5"
  if compare --norm-rtol 1e-5 --skip-rng "$work/$want/$final" "$work/$got/$final" >"$work/$got.cmp" 2>&1; then
    echo "ok: resumed across topologies ($got) == uninterrupted ($want) within 1e-5"
  else
    fail "$got differs from $want beyond 1e-5: $(tail -5 "$work/$got.cmp")"
  fi
done
n_direct=$(grep -c "load: O_DIRECT on (1 rank(s) on this host)" "$work/e.log" || true)
[ "$n_direct" -eq 2 ] || fail "expected both ranks alone on their node to load with O_DIRECT, saw $n_direct: \
$(grep 'O_DIRECT' "$work/e.log" | head -4)"

if [ "$failures" -eq 0 ]; then
  status=0
  echo "PASS: h5ddp across nodes under mpirun"
fi
exit "$status"

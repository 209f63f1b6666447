#!/usr/bin/env bash
# Checkpoint save and load across nodes (issue 22): the same bytes at 1 node x 4 ranks and 2 nodes x 2 ranks,
# and the two load strategies (every rank reads / share + exchange) at each. The nodes are network namespaces
# of tests/cluster/cluster.sh on this one machine: MPI between nodes is TCP over a veth bridge, the file
# system and the page cache are shared (what this can and cannot say: docs/BENCHMARKS.md "Across nodes").
# Needs root (namespaces). Each repetition runs both topologies, the order alternating.
#   tools/bench/cluster_bench.sh [BUILD_DIR] [SCRATCH_DIR]      env: REPS=3 GIB=1 FSYNC=1 PY=/usr/bin/python3
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
scratch="${2:-${TMPDIR:-/tmp}/h5ddp-cluster-bench}"
reps=${REPS:-3} gib=${GIB:-1} fsync=${FSYNC:-1} py=${PY:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-cluster-bench-work.XXXXXX")
trap '"$here/../../tests/cluster/cluster.sh" stop "$work/c" || true; rm -rf "$work" "$scratch"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE
"$here/../../tests/cluster/cluster.sh" start "$work/c" 2
printf 'node0 slots=4\n' >"$work/1x4"
printf 'node0 slots=2\nnode1 slots=2\n' >"$work/2x2"
run() {
  local topo=$1 rep=$2
  rm -rf "$scratch"
  "$here/../../tests/cluster/cluster.sh" exec "$work/c" node0 mpirun --oversubscribe --hostfile "$work/$topo" \
    -np 4 --mca plm_rsh_agent "$work/c/rsh" --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 \
    "$build/tools/bench/h5ddp-bench-checkpoint" --gib "$gib" --dir "$scratch" --fsync "$fsync" --reps 1 \
    --order "$rep" | grep '^RESULT' | sed "s/^RESULT /RESULT topo=$topo /"
}
for ((rep = 0; rep < reps; rep++)); do
  echo "repetition $((rep + 1))/$reps" >&2
  if ((rep % 2 == 0)); then run 1x4 "$rep"; run 2x2 "$rep"; else run 2x2 "$rep"; run 1x4 "$rep"; fi |
    tee -a "$work/results" >&2
done
"$py" - "$work/results" "$gib" "$reps" <<'PYEOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = dict(w.split("=", 1) for w in line.split()[1:])
    if f["method"] not in ("h5ddp", "h5ddp_every_rank_reads", "h5ddp_share_exchange", "raw_mpiio"):
        continue
    rows.setdefault((f["op"], f["method"]), {}).setdefault(f["topo"], []).append(float(f["seconds"]))
print(f"{sys.argv[2]} GiB, 4 ranks, median of {sys.argv[3]} repetitions (seconds)\n")
print("| op | method | 1 node x 4 | 2 nodes x 2 | 2x2 / 1x4 |")
print("|---|---|---|---|---|")
for (op, method), t in sorted(rows.items()):
    a, b = statistics.median(t.get("1x4", [float("nan")])), statistics.median(t.get("2x2", [float("nan")]))
    print(f"| {op} | {method} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
PYEOF

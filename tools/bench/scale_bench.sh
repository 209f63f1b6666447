#!/usr/bin/env bash
# Scale benchmark (issue 42, docs/SCALING.md): what one save and one load ask of MPI per rank, counted, at
# 2/4/8/16 ranks and two tensor counts, with h5ddp-bench-checkpoint's MPI call counters (tools/bench/mpi_counters.c).
# Oversubscribed on one machine: the times show the trend only; the counts are exact.
#   tools/bench/scale_bench.sh [BUILD_DIR] [SCRATCH_DIR]     env: RANKS="2 4 8 16", TENSORS="48 3000", GIB=0.05
set -euo pipefail
build="${1:-build}"
scratch="${2:-${TMPDIR:-/tmp}/h5ddp-scale-bench}"
bench="$build/tools/bench/h5ddp-bench-checkpoint"
trap 'rm -rf "$scratch"' EXIT
export OMP_NUM_THREADS=1
mpi=(mpirun --allow-run-as-root --oversubscribe)
echo "| ranks | tensors | op | seconds | collectives | bytes into collectives | p2p messages | p2p bytes | MPI-IO calls |"
echo "|---|---|---|---|---|---|---|---|---|"
for t in ${TENSORS:-48 3000}; do
  for np in ${RANKS:-2 4 8 16}; do
    rm -rf "$scratch"
    "${mpi[@]}" -np "$np" "$bench" --gib "${GIB:-0.05}" --dir "$scratch" --fsync 1 --reps 1 --methods h5ddp \
      --tensors "$t" | grep '^RESULT' |
      awk '{ for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
             printf "| %s | %s | %s %s | %s | %s | %s | %s | %s | %s |\n", v["ranks"], v["tensors"], v["op"],
               v["method"], v["seconds"], v["collectives"], v["coll_bytes"], v["p2p"], v["p2p_bytes"], v["file_calls"] }'
  done
done

#!/usr/bin/env bash
# Checkpoint benchmark driver: h5ddp save/load vs raw MPI-IO vs rank-0 torch::pickle_save/load, for the cases
# of issue 4, all in one run; prints the markdown tables for docs/BENCHMARKS.md "## Checkpoint".
#   tools/bench/checkpoint_bench.sh [BUILD_DIR] [SCRATCH_DIR]      (env: REPS=2, FOLK_MAX_GIB=1, CASES="1:1 1:2 3:1 3:2 1:4",
#                                                                    SETTLE=0: seconds between eviction and each load)
# Each case is "GiB:ranks"; each runs without and with fsync. Files are deleted after every measurement.
set -euo pipefail
build="${1:-build}"
scratch="${2:-${TMPDIR:-/tmp}/h5ddp-ckpt-bench}"
reps="${REPS:-2}"
settle="${SETTLE:-0}"
folk_max="${FOLK_MAX_GIB:-1}"
cases="${CASES:-1:1 1:2 1:4 3:1 3:2}"
bench="$build/tools/bench/h5ddp-bench-checkpoint"
results="$(mktemp)"
df -h "$(dirname "$scratch")" >&2
for c in $cases; do
  gib="${c%%:*}"; np="${c#*:}"
  for fsync in 0 1; do
    methods="h5ddp,raw,raw_direct"
    # torch::pickle_save/load runs at ~25 MB/s here and needs ~3x the state in memory: measured once per case
    # (with fsync), and only up to FOLK_MAX_GIB.
    if [ "$fsync" = 1 ] && awk "BEGIN{exit !($gib <= $folk_max)}"; then methods="$methods,folk"; fi
    echo "case ${gib} GiB, ${np} ranks, fsync=${fsync}: $methods" >&2
    rm -rf "$scratch"
    OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np "$np" "$bench" --gib "$gib" --dir "$scratch" \
      --fsync "$fsync" --methods "$methods" --reps "$reps" --settle "$settle" --folk-load root | tee -a "$results" | grep RESULT >&2 || true
    rm -rf "$scratch"
  done
done
python3 "$(dirname "$0")/checkpoint_bench_table.py" "$results"
rm -f "$results"

#!/usr/bin/env bash
# Runs h5ddp-bench-async at 1 and 2 ranks with 1 GiB of state and prints the markdown tables for
# docs/BENCHMARKS.md "## Async checkpoints". Usage: tools/bench/async_bench.sh BUILD_DIR [DIR] [extra options]
set -euo pipefail
build=${1:?usage: async_bench.sh BUILD_DIR [DIR] [options]}
dir=${2:-${TMPDIR:-/tmp}/h5ddp-bench-async}
shift $(( $# >= 2 ? 2 : 1 ))
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "host: $(hostname), $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), dir $dir ($(df -h --output=fstype "$(dirname "$dir")" | tail -1))"
for np in ${RANKS:-1 2}; do
  echo
  echo "## $np rank(s)"
  mpirun --allow-run-as-root --oversubscribe -np "$np" "$build/tools/bench/h5ddp-bench-async" --dir "$dir" \
    --state-mib "${STATE_MIB:-1024}" "$@"
done

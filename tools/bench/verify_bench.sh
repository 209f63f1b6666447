#!/usr/bin/env bash
# Verification benchmark: `h5ddp-ckpt verify` (every checksum recomputed, as a load does on
# resume) against `cat FILE > /dev/null` (one sequential read of the same bytes, nothing checked), page cache
# cold (evicted with posix_fadvise DONTNEED) and warm, alternating which runs first; each XXH3 kernel.
#   tools/bench/verify_bench.sh [BUILD_DIR] [SCRATCH_DIR]      (env: REPS=3, MLP_HIDDEN=8192,8192,4096)
# The checkpoint is an Adam MLP saved after one step (1.2 GiB with the default widths); deleted at the end.
set -euo pipefail
build="${1:-build}"
scratch="${2:-${TMPDIR:-/tmp}/h5ddp-verify-bench}"
reps="${REPS:-3}"
rm -rf "$scratch"
OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 1 "$build/tools/h5ddp-train" --model mlp \
  --mlp-hidden "${MLP_HIDDEN:-8192,8192,4096}" --max-steps 1 --batch-size 8 --run-dir "$scratch" >/dev/null 2>&1
file="$(ls "$scratch"/ckpt-*.h5 | tail -1)"
echo "file: $file ($(du -h "$file" | cut -f1))"
evict() { /usr/bin/python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fdatasync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$file"; }
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); awk "BEGIN{print $t1 - $t0}"; }
kernels="$("$build/tools/bench/h5ddp-bench-hash" --gib 0.01 --reps 1 | sed -n 's/.*kernel=\([a-z0-9]*\) .*/\1/p' | sort -u | tr '\n' ' ')"
echo "| cache | rep | cat (s) | $(for k in $kernels; do printf 'verify %s (s) | ' "$k"; done)$(for k in $kernels; do printf 'cat / verify %s | ' "$k"; done)"
echo "|---|---|---|$(for k in $kernels; do printf -- '---|---|'; done)"
for cache in cold warm; do
  for rep in $(seq "$reps"); do
    declare -A t=()
    order="cat $kernels"
    [ $((rep % 2)) = 0 ] && order="$kernels cat"
    for what in $order; do
      if [ "$cache" = cold ]; then evict; else cat "$file" >/dev/null; fi
      if [ "$what" = cat ]; then t[$what]=$(seconds cat "$file")
      else t[$what]=$(H5DDP_HASH_KERNEL=$what seconds "$build/tools/h5ddp-ckpt" verify "$file"); fi
    done
    line="| $cache | $rep | $(printf '%.3f' "${t[cat]}") |"
    for k in $kernels; do line="$line $(printf '%.3f' "${t[$k]}") |"; done
    for k in $kernels; do line="$line $(awk "BEGIN{printf \"%.2f\", ${t[cat]} / ${t[$k]}}") |"; done
    echo "$line"
    unset t
  done
done
rm -rf "$scratch"

#!/usr/bin/env bash
# Load read counts (issue 59, docs/SCALING.md "What a load does per rank"): every read system call each rank makes
# on the checkpoint file during one load, counted by strace (tools/bench/count_file_reads.py), and the library's own
# counters (HDF5 opens, coalesced reads) printed by h5ddp-bench-load; then the same load without strace, timed.
# Oversubscribed on one machine: the times show the trend only; the counts are exact.
#   tools/bench/load_reads.sh [BUILD_DIR] [SCRATCH_DIR]
#     env: RANKS="2 4 8 16", TENSORS="48 3000 12000", GIB=0.25, STRATEGIES="every share", PY=/usr/bin/python3
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:-build}" && pwd)"
scratch="${2:-${TMPDIR:-/tmp}/h5ddp-load-reads}"
bench="$build/tools/bench/h5ddp-bench-load"
py="${PY:-/usr/bin/python3}"
rm -rf "$scratch"
mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT
export OMP_NUM_THREADS=1
mpi=(mpirun --allow-run-as-root --oversubscribe)
echo "| tensors | datasets | ranks | strategy | reader: opens, reads | other ranks: opens, reads (most), MB read (most) | library counter: coalesced reads (most) | seconds, no strace |"
echo "|---|---|---|---|---|---|---|---|"
for t in ${TENSORS:-48 3000 12000}; do
  file="$scratch/c$t.h5"
  "${mpi[@]}" -np 2 "$bench" --make "$file" --tensors "$t" --gib "${GIB:-0.25}" >/dev/null
  for np in ${RANKS:-2 4 8 16}; do
    for s in ${STRATEGIES:-every share}; do
      rm -f "$scratch"/st.*
      out="$("${mpi[@]}" -np "$np" sh -c "exec strace -f -qq -e trace=openat,open,close,read,pread64,readv,preadv,preadv2 \
        -o '$scratch'/st.\$OMPI_COMM_WORLD_RANK '$bench' '$file' --strategy $s")"
      datasets="$(sed -n 's/.*datasets=\([0-9]*\).*/\1/p' <<<"$out")"
      coalesced="$(sed -n 's/.*coalesced_reads=\([0-9]*\).*/\1/p' <<<"$out" | sort -n | tail -1)"
      counts="$("$py" "$here/count_file_reads.py" "$file" "$scratch"/st.*)"
      reader="$(grep "st.0 " <<<"$counts" | sed 's/.*opens=\([0-9]*\) reads=\([0-9]*\).*/\1, \2/')"
      others="$(grep -v "st.0 " <<<"$counts" | awk '{ for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
        if (v["opens"] > o) o = v["opens"]; if (v["reads"] > r) r = v["reads"]; if (v["bytes"] > b) b = v["bytes"] }
        END { printf "%d, %d, %.0f", o, r, b / 1e6 }')"
      secs="$("${mpi[@]}" -np "$np" "$bench" "$file" --strategy "$s" | sed -n 's/.*seconds=\([0-9.]*\).*/\1/p')"
      echo "| $t | $datasets | $np | $s | $reader | ${others:--} | $coalesced | $secs |"
    done
  done
  rm -f "$file"
done

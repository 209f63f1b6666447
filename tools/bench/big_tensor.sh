#!/usr/bin/env bash
# Tensors over 2 GiB (issue 42): h5ddp-bench-big-tensor saves a 2.1 GiB float32 tensor (replicated, and with a
# second one held by one rank: sharded optimizer state) at 1, 2 and 4 ranks and loads each file at another rank
# count, every element checked; h5ddp-ckpt verify checks every checksum; h5py reads the last rows of each tensor
# and compares them with the pattern. Needs ~5 GiB of memory per rank that holds both tensors and 4.5 GiB of disk.
#   tools/bench/big_tensor.sh [BUILD_DIR] [SCRATCH_DIR]      env: GIB=2.1, PY=/usr/bin/python3
set -euo pipefail
build="${1:-build}"
scratch="${2:-${TMPDIR:-/tmp}/h5ddp-big-tensor}"
py="${PY:-/usr/bin/python3}"
gib="${GIB:-2.1}"
bench="$build/tools/bench/h5ddp-bench-big-tensor"
trap 'rm -rf "$scratch"' EXIT
export OMP_NUM_THREADS=1
mpi=(mpirun --allow-run-as-root --oversubscribe)
last_rows() {  # the last 3 rows of each tensor in the file, as h5py reads them, against the pattern
  "$py" - "$1" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    for path, sign, mod in [("/model/huge.weight", 1, 1000003), ("/optimizer/state/huge.weight/momentum_buffer", -1, 999983)]:
        if path not in f:
            continue
        d = f[path]
        rows = d.shape[0]
        got = d[rows - 3:rows]
        idx = np.arange((rows - 3) * 1024, rows * 1024, dtype=np.int64).reshape(3, 1024)
        want = (sign * (idx % mod)).astype(np.float32)
        ok = np.array_equal(got, want)
        print(f"h5py {path}: shape {d.shape}, {d.size * 4 / 2**30:.2f} GiB, last 3 rows {'match' if ok else 'DIFFER'}")
        if not ok:
            sys.exit(1)
PY
}
for sharded in 0 1; do
  for pair in 1:4 2:1 4:2 ${EXTRA_PAIRS:-}; do
    save_np=${pair%%:*} load_np=${pair#*:}
    for write in ${WRITES:-direct}; do
      rm -rf "$scratch" && mkdir -p "$scratch"
      "${mpi[@]}" -np "$save_np" "$bench" save --dir "$scratch" --gib "$gib" --sharded $sharded --write "$write"
      "$build/tools/h5ddp-ckpt" verify "$scratch/big.h5" | tail -1
      last_rows "$scratch/big.h5"
      "${mpi[@]}" -np "$load_np" "$bench" load --dir "$scratch" --gib "$gib" --sharded $sharded
    done
  done
done

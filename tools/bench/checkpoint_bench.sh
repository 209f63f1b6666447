#!/usr/bin/env bash
# Checkpoint benchmark driver: h5ddp save/load against what PyTorch users run (rank 0's Python torch.save, every
# rank's torch.load(map_location="cpu")), dd of the same bytes (the disk's limit) and raw MPI-IO, all in one run;
# prints the markdown tables for docs/BENCHMARKS.md "## Checkpoint".
#   tools/bench/checkpoint_bench.sh [BUILD_DIR] [SCRATCH_DIR]
#     env: REPS=3, CASES="0.45:2 0.45:4 1:1 1:2 1:4" (GiB:ranks), FSYNCS="1" (0 and/or 1), SETTLE=0 (seconds between
#          eviction and each h5ddp/raw load), PY=/usr/bin/python3, H5DDP_BENCH_ENV (extra env for h5ddp, e.g. a
#          setting under test), VARIANTS="" (space-separated LABEL:VAR=VALUE: h5ddp runs again in every repetition
#          with that environment, its methods tagged @LABEL, e.g. VARIANTS="nobounce:H5DDP_LOAD_BOUNCE=0"),
#          TENSORS=48 (tensor count of the state, both programs: the many-tensor table of issue 42),
#          METHODS=h5ddp,raw,raw_direct,mpiio (h5ddp-bench-checkpoint --methods; mpiio: h5ddp's save again with
#          --checkpoint-write mpiio, its own table)
# Each repetition runs h5ddp-bench-checkpoint (h5ddp, raw MPI-IO, raw O_DIRECT) and tools/bench/torch_ckpt_peer.py
# (torch.save/load, dd) once, the order alternating by repetition so that drift in the machine hits both.
# Files are deleted after every measurement.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
scratch="${2:-${TMPDIR:-/tmp}/h5ddp-ckpt-bench}"
reps="${REPS:-3}"
settle="${SETTLE:-0}"
cases="${CASES:-0.45:2 0.45:4 1:1 1:2 1:4}"
fsyncs="${FSYNCS:-1}"
py="${PY:-/usr/bin/python3}"
bench="$build/tools/bench/h5ddp-bench-checkpoint"
results="$(mktemp)"
trap 'rm -f "$results"; rm -rf "$scratch"' EXIT
export OMP_NUM_THREADS=1
mpi=(mpirun --allow-run-as-root --oversubscribe)
# One run of each program for the case and repetition set by the loops below (gib, np, fsync, rep).
h5() {
  rm -rf "$scratch"
  env ${H5DDP_BENCH_ENV:-} "${mpi[@]}" -np "$np" "$bench" --gib "$gib" --dir "$scratch" --fsync "$fsync" \
    --reps 1 --order "$rep" --settle "$settle" --tensors "${TENSORS:-48}" --methods "${METHODS:-h5ddp,raw,raw_direct,mpiio}"
}
peer() {
  rm -rf "$scratch"
  "${mpi[@]}" -np "$np" "$py" "$here/torch_ckpt_peer.py" --gib "$gib" --dir "$scratch" --fsync "$fsync" \
    --tensors "${TENSORS:-48}"
}
# h5 once per entry of VARIANTS, with its environment, methods tagged @LABEL.
variants() {
  for v in ${VARIANTS:-}; do
    H5DDP_BENCH_ENV="${H5DDP_BENCH_ENV:-} ${v#*:}" h5 | sed "s/ method=\([a-z0-9_]*\)/ method=\1@${v%%:*}/"
  done
}
df -h "$(dirname "$scratch")" >&2
for c in $cases; do
  gib="${c%%:*}"; np="${c#*:}"
  for fsync in $fsyncs; do
    for ((rep = 0; rep < reps; rep++)); do
      echo "case ${gib} GiB, ${np} ranks, fsync=${fsync}, repetition $((rep + 1))/$reps" >&2
      if ((rep % 2 == 0)); then h5; variants; peer; else peer; variants; h5; fi | tee -a "$results" |
        grep RESULT >&2 || true
      rm -rf "$scratch"
    done
  done
done
"$py" "$here/checkpoint_bench_table.py" "$results"

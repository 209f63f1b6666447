#!/usr/bin/env bash
# Issue 59: the template-save prototype (h5ddp-bench-template-save) side by side with h5ddp's save and torch.save,
# 0.25 GiB as T tensors, durable, the order rotating by repetition. Prints RESULT lines tagged tensors=T rep=R.
#   tools/bench/template_bench.sh [BUILD_DIR] [SCRATCH_DIR]     env: TENSORS="3000 12000", REPS=3, GIB=0.25, NP=2,
#                                                                    PY=/usr/bin/python3,
#                                                                    METHODS="h5ddp torch template template_ranks"
# h5ddp: h5ddp-bench-checkpoint at NP ranks (an untimed warm-up save, then one timed save, no load); torch:
# tools/bench/torch_ckpt_peer.py at NP ranks (rank 0 torch.save + fsync; its load is not reported); template,
# template2 and template_ranks: saves through a template of a file h5ddp wrote at the same T (an untimed warm-up
# save, then one timed save) by one process, one process with 2 threads, NP processes (mpirun).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
scratch="${2:-${TMPDIR:-/tmp}/h5ddp-template-bench}"
reps="${REPS:-3}" gib="${GIB:-0.25}" np="${NP:-2}" py="${PY:-/usr/bin/python3}"
trap 'rm -rf "$scratch"' EXIT
export OMP_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE
mpi=(mpirun --allow-run-as-root --oversubscribe -np "$np")
tag() { sed -n "s/^RESULT /RESULT tensors=$T rep=$rep /p"; }
h5() {
  "${mpi[@]}" "$build/tools/bench/h5ddp-bench-checkpoint" --gib "$gib" --dir "$scratch/h5" --fsync 1 --load 0 \
    --methods h5ddp --tensors "$T" "$@"
}
run_h5ddp() { h5 --order "$rep" | grep "op=save" | tag; rm -rf "$scratch/h5"; }
run_torch() {
  "${mpi[@]}" "$py" "$here/torch_ckpt_peer.py" --gib "$gib" --dir "$scratch/pt" --fsync 1 --tensors "$T" \
    --methods torch | grep "op=save" | tag
  rm -rf "$scratch/pt"
}
template() {
  ${launch:-} "$build/tools/bench/h5ddp-bench-template-save" "$scratch/src.h5" "$scratch/tmpl/out.h5" --reps 1 --warmup 1 \
    --ranks-split "$1" | grep RESULT | sed "s/method=template /method=template$2 /" | tag
  rm -rf "$scratch/tmpl"
}
run_template() { mkdir -p "$scratch/tmpl" && template 1 ""; }
run_template2() { mkdir -p "$scratch/tmpl" && template 2 "_2threads"; }
run_template_ranks() { mkdir -p "$scratch/tmpl" && launch="${mpi[*]}" template 1 "_${np}ranks"; }
read -r -a methods <<< "${METHODS:-h5ddp torch template template_ranks}"
for T in ${TENSORS:-3000 12000}; do
  rm -rf "$scratch" && mkdir -p "$scratch"
  rep=prep h5 --keep "$scratch/src.h5" >/dev/null  # the template's source file, written by h5ddp at T
  for ((rep = 0; rep < reps; rep++)); do
    echo "tensors $T, repetition $((rep + 1))/$reps" >&2
    for ((k = 0; k < ${#methods[@]}; k++)); do "run_${methods[(k + rep) % ${#methods[@]}]}"; done
  done
done

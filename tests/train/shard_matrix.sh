#!/usr/bin/env bash
# Sharding stages (issue 39): element-range ZeRO-1/2 train like replicated, and a file written under any stage at
# any rank count resumes under any stage at any rank count. An MLP whose fc1.weight [96, 784] is split between
# the ranks (one gradient bucket, cut between rows).
#  1. Equivalence: 8 steps under --shard optimizer and --shard gradients at 1, 2 and 4 ranks against the replicated
#     run at the same rank count. Bitwise at 1 and 2 ranks (a sum of two is the same in a reduce-scatter and an
#     allreduce, and Adam is elementwise, so stepping row pieces is stepping the tensor); at 4 ranks Adam per tensor
#     within ||a-b|| <= 1e-5 ||b|| (Open MPI may add four ranks' gradients in another order).
#  2. The reshard matrix as one chain of legs, each resuming the file the previous leg wrote: written under
#     {none, optimizer, gradients} x {1, 2, 3, 4 ranks} and resumed under each stage at 1, 2, 3 and 4 ranks:
#       fresh -> 4 gradients -> 3 optimizer -> 1 gradients -> 2 none -> 4 optimizer -> 2 gradients -> 3 none ->
#       1 optimizer -> 4 none -> 2 optimizer
#     every stage writes at >= 3 rank counts and is resumed from every stage; rank counts 1-4 each read and write.
#     The reference is the same chain of world sizes run replicated (--shard none every leg), so only the stages
#     differ: Adam per tensor within 1e-5. (Against the uninterrupted 1-rank run, ten world-size changes alone
#     drift further, ~2.5e-4 in exp_avg for the replicated chain too: resume_elastic.sh bounds 3 changes.)
#     Stage 3 (parameters) is not built: --shard parameters is refused (checked last).
#  3. Another model under a sharded resume: one error listing the differences, on every rank, and no step taken.
BATCH_SIZE=24 RUN_TIMEOUT=300  # 24 divides by 1, 2, 3 and 4 ranks
source "$(dirname "$0")/lib.sh"
common=(--optimizer adam --dropout 0 --seed 9 --data-dir "$SMALL_DATA" --model mlp)
base=("${common[@]}" --mlp-hidden 96)

# 1. equivalence at the same rank count
for np in 1 2 4; do
  run_train "$np" "$WORK/rep$np.log" "${base[@]}" --max-steps 8 --run-dir "$WORK/rep$np" ||
    { cat "$WORK/rep$np.log"; fail "replicated run at $np ranks failed"; }
  for stage in optimizer gradients; do
    run_train "$np" "$WORK/$stage$np.log" "${base[@]}" --max-steps 8 --shard $stage --run-dir "$WORK/$stage$np" ||
      { cat "$WORK/$stage$np.log"; fail "--shard $stage at $np ranks failed"; }
    if [ "$np" -le 2 ]; then
      compare "$WORK/rep$np/ckpt-00000008.h5" "$WORK/$stage$np/ckpt-00000008.h5" --skip-rng
    else
      compare "$WORK/rep$np/ckpt-00000008.h5" "$WORK/$stage$np/ckpt-00000008.h5" --skip-rng --norm-rtol 1e-5
    fi
    echo "PASS: --shard $stage at $np ranks trains like replicated"
  done
done
"$PY" - "$WORK/gradients4/ckpt-00000008.h5" "$HERE/../../python" <<'PY'
import sys, h5py
sys.path.insert(0, sys.argv[2])
from h5ddp_torch.verify import verify
with h5py.File(sys.argv[1]) as f:
    shard = f["meta"].attrs["shard"]
    shard = shard.decode() if isinstance(shard, bytes) else shard
    assert shard == "gradients", f"/meta shard is {shard!r}"
problems = verify(sys.argv[1])  # every rule and checksum, fc1.weight's state written in pieces by 4 ranks
assert problems == [], problems
print("PASS: /meta shard records the stage; the Python package verifies the file written in pieces")
PY

# 2. the reshard chain, and the same world sizes replicated
chain() {  # chain DIR STAGE_OVERRIDE: the legs into DIR; STAGE_OVERRIDE (e.g. none) replaces every leg's stage
  local dir=$1 override=${2:-} steps=2 prev="" prev_np="" np stage
  for leg in "4 gradients" "3 optimizer" "1 gradients" "2 none" "4 optimizer" "2 gradients" "3 none" "1 optimizer" \
    "4 none" "2 optimizer"; do
    read -r np stage <<<"$leg"
    stage=${override:-$stage}
    run_train "$np" "$dir.$steps.log" "${base[@]}" --shard "$stage" --max-steps $steps --run-dir "$dir" ||
      { cat "$dir.$steps.log"; fail "leg to step $steps at $np ranks under --shard $stage failed"; }
    if [ -n "$prev" ]; then
      grep -q "resumed from .*ckpt-$(printf %08d $prev).h5 at step $prev,.*saved at $prev_np ranks, now $np" "$dir.$steps.log" ||
        { cat "$dir.$steps.log"; fail "leg at $np ranks ($stage) did not resume step $prev saved at $prev_np ranks"; }
    fi
    echo "leg: step $prev -> $steps at $np ranks under --shard $stage"
    prev=$steps prev_np=$np
    steps=$((steps + 2))
  done
}
chain "$WORK/m"
chain "$WORK/r" none
compare "$WORK/r/ckpt-00000020.h5" "$WORK/m/ckpt-00000020.h5" --skip-rng --norm-rtol 1e-5
echo "PASS: reshard chain across stages none/optimizer/gradients and 1-4 ranks within 1e-5 of the replicated chain"

# 3. another model under --shard gradients: one error listing the differences; stage 3 refused
if run_train 2 "$WORK/other.log" "${common[@]}" --mlp-hidden 80 --shard gradients --max-steps 22 --run-dir "$WORK/m"; then
  fail "a different model resumed"
fi
grep -q "does not match the state to load into on rank 0 ([0-9]* differences)" "$WORK/other.log" ||
  { cat "$WORK/other.log"; fail "no single error listing the differences"; }
grep -q "fc1.weight: expected float32 \[80,784\], found float32 \[96,784\]" "$WORK/other.log" ||
  { cat "$WORK/other.log"; fail "the error does not name fc1.weight's shapes"; }
if run_train 2 "$WORK/s3.log" "${base[@]}" --shard parameters --max-steps 2 --run-dir "$WORK/s3"; then
  fail "--shard parameters ran"
fi
grep -q "not built yet" "$WORK/s3.log" || { cat "$WORK/s3.log"; fail "--shard parameters: no clear refusal"; }
echo "PASS: a different model under a sharded resume is one error listing the differences; stage 3 refused"

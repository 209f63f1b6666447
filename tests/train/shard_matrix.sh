#!/usr/bin/env bash
# Sharding stages (issue 39): element-range ZeRO-1/2/3 train like replicated, and a file written under any stage at
# any rank count resumes under any stage at any rank count. An MLP whose fc1.weight [96, 784] is split between
# the ranks (one gradient bucket, cut between rows; under stage 3 each parameter is cut alone).
#  1. Equivalence: 8 steps under --shard optimizer, gradients and parameters at 1, 2 and 4 ranks against the
#     replicated run at the same rank count. Bitwise at 1 and 2 ranks (a sum of two is the same in a reduce-scatter
#     and an allreduce, Adam is elementwise, so stepping row pieces is stepping the tensor, and stage 3's gathered
#     weights are the stepped bytes); at 4 ranks Adam per tensor within ||a-b|| <= 1e-5 ||b|| (Open MPI may add
#     four ranks' gradients in another order).
#  2. The reshard matrix as one chain of legs, each resuming the file the previous leg wrote (P parameters,
#     O optimizer, G gradients, N none; the number is the rank count):
#       fresh -> P4 -> O3 -> P1 -> P2 -> G4 -> P3 -> N1 -> G2 -> N4 -> P2 -> O3 -> G1
#     Stage 3, whose model is in row pieces too, writes at 1, 2, 3 and 4 ranks, is resumed under every stage
#     (O3, P2, G4, N1) and resumes files of every stage (O3, P1, G4, N4); stages 1 and 2 write at two rank counts
#     and read from and into none and parameters; rank counts 1-4 each read and write. The reference is the same
#     chain of world sizes run replicated (--shard none every leg), so only the stages differ: Adam per tensor
#     within 1e-5. (Against the uninterrupted 1-rank run, eleven world-size changes alone drift further, ~2.5e-4
#     in exp_avg for the replicated chain too: resume_elastic.sh bounds 3 changes.)
#  3. Another model under a sharded resume (stages 2 and 3): one error listing the differences, on every rank.
BATCH_SIZE=24 RUN_TIMEOUT=300  # 24 divides by 1, 2, 3 and 4 ranks
source "$(dirname "$0")/lib.sh"
common=(--optimizer adam --dropout 0 --seed 9 --data-dir "$SMALL_DATA" --model mlp)
base=("${common[@]}" --mlp-hidden 96)

# 1. equivalence at the same rank count
for np in 1 2 4; do
  run_train "$np" "$WORK/rep$np.log" "${base[@]}" --max-steps 8 --run-dir "$WORK/rep$np" ||
    { cat "$WORK/rep$np.log"; fail "replicated run at $np ranks failed"; }
  for stage in optimizer gradients parameters; do
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
"$PY" - "$WORK" "$HERE/../../python" <<'PY'
import sys, h5py
sys.path.insert(0, sys.argv[2])
from h5ddp_torch.verify import verify
for stage in ("gradients", "parameters"):
    path = f"{sys.argv[1]}/{stage}4/ckpt-00000008.h5"
    with h5py.File(path) as f:
        shard = f["meta"].attrs["shard"]
        shard = shard.decode() if isinstance(shard, bytes) else shard
        assert shard == stage, f"/meta shard is {shard!r}"
    # every rule and checksum: fc1.weight's state (and under stage 3 the weight itself) written in pieces by 4 ranks
    problems = verify(path)
    assert problems == [], problems
print("PASS: /meta shard records the stage; the Python package verifies the files written in pieces")
PY

# 2. the reshard chain, and the same world sizes replicated
chain() {  # chain DIR STAGE_OVERRIDE: the legs into DIR; STAGE_OVERRIDE (e.g. none) replaces every leg's stage
  local dir=$1 override=${2:-} steps=2 prev="" prev_np="" np stage
  for leg in "4 parameters" "3 optimizer" "1 parameters" "2 parameters" "4 gradients" "3 parameters" "1 none" \
    "2 gradients" "4 none" "2 parameters" "3 optimizer" "1 gradients"; do
    read -r np stage <<<"$leg"
    stage=${override:-$stage}
    run_train "$np" "$dir.$steps.log" "${base[@]}" --shard "$stage" --max-steps $steps --run-dir "$dir" ||
      { cat "$dir.$steps.log"; fail "leg to step $steps at $np ranks under --shard $stage failed"; }
    if [ -n "$prev" ]; then
      grep -q "resumed from .*ckpt-$(printf %08d $prev).h5 at step $prev,.*saved at $prev_np ranks\?, now $np" "$dir.$steps.log" ||
        { cat "$dir.$steps.log"; fail "leg at $np ranks ($stage) did not resume step $prev saved at $prev_np ranks"; }
    fi
    echo "leg: step $prev -> $steps at $np ranks under --shard $stage"
    prev=$steps prev_np=$np
    steps=$((steps + 2))
  done
}
chain "$WORK/m"
chain "$WORK/r" none
compare "$WORK/r/ckpt-00000024.h5" "$WORK/m/ckpt-00000024.h5" --skip-rng --norm-rtol 1e-5
echo "PASS: reshard chain across stages none/optimizer/gradients/parameters and 1-4 ranks within 1e-5 of the replicated chain"

# 3. another model under --shard gradients and --shard parameters: one error listing the differences
for stage in gradients parameters; do
  if run_train 2 "$WORK/other.log" "${common[@]}" --mlp-hidden 80 --shard $stage --max-steps 26 --run-dir "$WORK/m"; then
    fail "a different model resumed under --shard $stage"
  fi
  grep -q "does not match the state to load into on rank 0 ([0-9]* differences)" "$WORK/other.log" ||
    { cat "$WORK/other.log"; fail "--shard $stage: no single error listing the differences"; }
  grep -q "fc1.weight: expected float32 \[80,784\], found float32 \[96,784\]" "$WORK/other.log" ||
    { cat "$WORK/other.log"; fail "--shard $stage: the error does not name fc1.weight's shapes"; }
done
echo "PASS: a different model under a sharded resume (stages 2 and 3) is one error listing the differences"

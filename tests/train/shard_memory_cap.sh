#!/usr/bin/env bash
# Issue 39, ZeRO-3 under a memory cap: each rank runs under a limit on its data segment (prlimit --data, the
# kernel's RLIMIT_DATA: every private writable mapping, so LibTorch's tensors whether malloc serves them from the
# heap or from mmap). An MLP of 4 hidden layers of 3072 (30.7 M parameters; Adam fp32: 16 bytes each = 469 MiB of
# training state) cannot train replicated at 4 ranks under CAP_MIB: the run fails on an allocation. The same cap,
# 4 ranks, --shard parameters: trains, saves, and resumes from its checkpoint (and the resumed run goes on).
# The cap sits between the two runs' measured needs (see docs/BENCHMARKS_TRAINING.md, "Sharded training state").
RUN_TIMEOUT=300 BATCH_SIZE=16
source "$(dirname "$0")/lib.sh"
CAP_MIB=${CAP_MIB:-900}
cap=$((CAP_MIB * 1024 * 1024))
args=(--model mlp --mlp-hidden 3072,3072,3072,3072 --optimizer adam --dropout 0 --seed 5 --data-dir "$SMALL_DATA")
capped() {  # capped LOG ARGS...: 4 ranks, each under the cap
  local log=$1
  shift
  timeout -k 5 "$RUN_TIMEOUT" "${MPIRUN[@]}" -np 4 prlimit --data="$cap:$cap" "$TRAIN" "${COMMON[@]}" "$@" >"$log" 2>&1
}

if capped "$WORK/rep.log" "${args[@]}" --max-steps 2 --run-dir "$WORK/rep"; then
  cat "$WORK/rep.log"
  fail "the replicated run trained under a ${CAP_MIB} MiB data limit: the cap does not bind"
fi
# LibTorch's allocator reports the failed tensor allocation; a thread's stack (mmap) failing under the same limit
# reads EAGAIN. Either way the run stopped before its first checkpoint.
grep -qiE "can't allocate memory|bad_alloc|cannot allocate|out of memory|Resource temporarily unavailable" \
  "$WORK/rep.log" || { cat "$WORK/rep.log"; fail "the replicated run failed, but not on an allocation"; }
[ ! -f "$WORK/rep/ckpt-00000002.h5" ] || fail "the replicated run wrote its checkpoint"
echo "PASS: replicated training does not fit in ${CAP_MIB} MiB per rank"

capped "$WORK/z3.log" "${args[@]}" --shard parameters --max-steps 3 --run-dir "$WORK/z3" ||
  { cat "$WORK/z3.log"; fail "--shard parameters did not train under the ${CAP_MIB} MiB limit"; }
[ -f "$WORK/z3/ckpt-00000003.h5" ] || fail "no checkpoint of the capped ZeRO-3 run"
capped "$WORK/z3b.log" "${args[@]}" --shard parameters --max-steps 5 --run-dir "$WORK/z3" ||
  { cat "$WORK/z3b.log"; fail "--shard parameters did not resume under the ${CAP_MIB} MiB limit"; }
grep -q "resumed from .*ckpt-00000003.h5 at step 3" "$WORK/z3b.log" || { cat "$WORK/z3b.log"; fail "did not resume step 3"; }
[ -f "$WORK/z3/ckpt-00000005.h5" ] || fail "the resumed run wrote no checkpoint at step 5"
"$H5DDP_BINARY_DIR/tools/h5ddp-ckpt" verify "$WORK/z3/ckpt-00000005.h5" >/dev/null || fail "the capped run's checkpoint does not verify"
echo "PASS: --shard parameters trains, saves and resumes at 4 ranks under ${CAP_MIB} MiB per rank"

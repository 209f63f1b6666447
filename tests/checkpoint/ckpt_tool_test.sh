#!/usr/bin/env bash
# Script test: a checkpoint written by 2 ranks is readable by h5dump and h5py (every tensor equal), and
# h5ddp-ckpt info / verify / diff give the documented output and exit codes, including on bad files.
# usage: ckpt_tool_test.sh BINARY_DIR SOURCE_DIR
set -uo pipefail
bin="$1"; src="$2"
py="${H5DDP_PYTHON:-/usr/bin/python3}"
ckpt="$bin/tools/h5ddp-ckpt"
mpirun=(mpirun --allow-run-as-root --oversubscribe -np 2)
work=$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-ckpt-tool-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
check() {  # check "what" expected_rc actual_rc
  if [ "$2" != "$3" ]; then echo "FAIL: $1: exit code $3, expected $2"; fail=1; else echo "ok: $1"; fi
}
expect_text() {  # expect_text "what" pattern file
  if grep -q -- "$2" "$3"; then echo "ok: $1"; else echo "FAIL: $1: '$2' not in output:"; cat "$3"; fail=1; fi
}

mkdir -p "$work/a" "$work/b" "$work/c"
a=$("${mpirun[@]}" "$bin/tests/checkpoint/checkpoint_fixture_writer" "$work/a" 7) || { echo "FAIL: writer"; exit 1; }
b=$("${mpirun[@]}" "$bin/tests/checkpoint/checkpoint_fixture_writer" "$work/b" 7) || { echo "FAIL: writer"; exit 1; }
c=$("${mpirun[@]}" "$bin/tests/checkpoint/checkpoint_fixture_writer" "$work/c" 9) || { echo "FAIL: writer"; exit 1; }
c_as_a="$work/c/$(basename "$a")"; cp "$c" "$c_as_a" 2>/dev/null || true

# h5dump -H shows the layout of docs/FORMAT.md
h5dump -H "$a" > "$work/dump.txt"; check "h5dump -H" 0 $?
for p in 'GROUP "model"' 'DATASET "big.weight"' 'GROUP "optimizer"' 'GROUP "param_groups"' 'GROUP "state"' \
         'DATASET "exp_avg_sq"' 'DATASET "samples_consumed"' 'GROUP "lr_scheduler"' 'DATASET "cpu"' \
         'ATTRIBUTE "xxh3"' 'ATTRIBUTE "format_version"' 'DATASET "position"'; do
  expect_text "h5dump shows $p" "$p" "$work/dump.txt"
done

# h5py reads every tensor and finds it equal to the writer's bytes
"$py" "$src/tests/checkpoint/checkpoint_h5py_test.py" "$a" "$work/a/expected"; check "h5py reads every tensor" 0 $?

# info
"$ckpt" info "$a" > "$work/info.txt"; check "info" 0 $?
expect_text "info: step" "step            207" "$work/info.txt"
expect_text "info: world size" "world size      2" "$work/info.txt"
expect_text "info: optimizer" "adam, 2 param group" "$work/info.txt"
expect_text "info: tree" "big.weight .*float32 .*\[1000,300\] .*1.1 MiB" "$work/info.txt"
expect_text "info: totals" "10 model tensors, 6 optimizer state tensors" "$work/info.txt"

# verify
"$ckpt" verify "$a" "$b" > "$work/verify.txt"; check "verify valid files" 0 $?
cp "$a" "$work/corrupt.h5"
"$py" - "$work/corrupt.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    off = f["/optimizer/state/big.weight/exp_avg"].id.get_offset()
with open(sys.argv[1], "r+b") as g:
    g.seek(off + 1000); c = g.read(1); g.seek(off + 1000); g.write(bytes([c[0] ^ 0xff]))
PY
"$ckpt" verify "$a" "$work/corrupt.h5" > "$work/verify2.txt"; check "verify corrupt file" 1 $?
expect_text "verify names the bad dataset" "checksum mismatch in dataset /optimizer/state/big.weight/exp_avg" "$work/verify2.txt"
expect_text "verify counts" "1 of 2 valid" "$work/verify2.txt"

# diff
"$ckpt" diff "$a" "$b" > "$work/diff1.txt"; check "diff identical" 0 $?
expect_text "diff verdict identical" "^identical" "$work/diff1.txt"
"$ckpt" diff "$a" "$c" > "$work/diff2.txt"; check "diff different" 1 $?
expect_text "diff verdict differ" "^differ" "$work/diff2.txt"
expect_text "diff per-tensor line" "/model/big.weight" "$work/diff2.txt"
"$ckpt" diff "$a" "$work/missing.h5" > "$work/diff3.txt" 2>&1; check "diff with a missing file" 2 $?

# clear errors for files that are not checkpoints
echo "hello" > "$work/text.h5"
"$py" -c "import h5py,sys; h5py.File(sys.argv[1],'w').create_dataset('x', data=[1,2])" "$work/plain.h5"
cp "$a" "$work/future.h5"
"$py" -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); f.attrs.modify('format_version', 99)" "$work/future.h5"
for case in "text.h5:not an HDF5 file" "plain.h5:not an h5ddp checkpoint" "future.h5:unsupported checkpoint format version 99"; do
  f="${case%%:*}"; msg="${case#*:}"
  "$ckpt" info "$work/$f" > "$work/err.txt" 2>&1; check "info $f" 1 $?
  expect_text "info $f says why" "$msg" "$work/err.txt"
  "$ckpt" verify "$work/$f" > "$work/err.txt" 2>&1; check "verify $f" 1 $?
  expect_text "verify $f says why" "$msg" "$work/err.txt"
done
"$ckpt" bogus > /dev/null 2>&1; check "unknown subcommand" 2 $?
exit $fail

#!/usr/bin/env bash
# cmake --install into a temporary prefix, then build and run a downstream project that uses find_package(h5ddp):
#   consumer     the MPI layer alone;
#   own_loop     tools/examples/own_loop.cpp (DDP + Checkpointer), SIGKILLed and resumed: bitwise equal to an
#                uninterrupted run (tests/examples/own_loop_resume.sh);
#   README       "Use h5ddp in your own training loop": its CMakeLists.txt and snippet as written: 150 steps, then 300
#                resuming (the step-100 file deleted in between must not come back), bitwise equal to 300 at once.
set -euo pipefail
bin="${H5DDP_BINARY_DIR:?}"; src="${H5DDP_SOURCE_DIR:?}"
PY="${H5DDP_PYTHON:-/usr/bin/python3}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cmake --install "$bin" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/include/h5ddp/checkpointer.hpp"
# The README's project: the one cpp block and the one cmake block of its "## Use h5ddp in your own training
# loop" section, as written: the CMakeLists.txt verbatim, train.cpp = readme_main.cpp with the snippet in it.
mkdir -p "$tmp/readme_project"
"$PY" - "$src/README.md" "$src/tests/install/consumer/readme_main.cpp" "$tmp/readme_project" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"^## Use h5ddp in your own training loop\n(.*?)(?=^## )", text, re.S | re.M)
assert m, "README.md has no '## Use h5ddp in your own training loop' section"
for lang in ("cpp", "cmake"):
    blocks = re.findall(rf"```{lang}\n(.*?)```", m.group(1), re.S)
    assert len(blocks) == 1, f"expected one {lang} block in the section, found {len(blocks)}"
    if lang == "cmake":
        assert "add_executable(train train.cpp)" in blocks[0], "the README's CMakeLists must build train.cpp"
        open(sys.argv[3] + "/CMakeLists.txt", "w").write(blocks[0])
    else:
        main = open(sys.argv[2]).read()
        assert "#include README_SNIPPET\n" in main
        open(sys.argv[3] + "/train.cpp", "w").write(main.replace("#include README_SNIPPET\n", blocks[0]))
PYEOF
cmake -S "$src/tests/install/consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release \
  -DH5DDP_EXAMPLE="$src/tools/examples/own_loop.cpp" >/dev/null
cmake -S "$tmp/readme_project" -B "$tmp/readme_build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/readme_build" -j2 >/dev/null
cmake --build "$tmp/build" -j2 >/dev/null
# h5ddp::h5ddp is the library without the application: find_package(h5ddp) exports no trainer library (models,
# data readers, option parser), so the own loop and the README's (DDP + Checkpointer + sampler) built without it.
! grep -rq "h5ddp_train" "$tmp/prefix"/lib*/cmake/h5ddp/ || fail "find_package(h5ddp) exports the trainer's library"
grep -q "h5ddp::h5ddp_torch" "$tmp/prefix"/lib*/cmake/h5ddp/h5ddpTargets.cmake || fail "no h5ddp::h5ddp_torch exported"
# No LD_LIBRARY_PATH: the installed libraries find each other and parallel HDF5 through their RUNPATH.
unset LD_LIBRARY_PATH
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
out=$("${MPIRUN[@]}" -np 2 "$tmp/build/consumer")
echo "$out"
grep -q "consumer: size=2 sum=3 OK" <<<"$out" || fail "consumer"

bash "$src/tests/examples/own_loop_resume.sh" "$tmp/build/own_loop" 2 kill

mkdir -p "$tmp/r1" "$tmp/r2"
(cd "$tmp/r1" && "${MPIRUN[@]}" -np 2 "$tmp/readme_build/train" 150) | grep -q "readme_loop: exit 0" || fail "readme 150"
[ -f "$tmp/r1/runs/mine/ckpt-00000100.h5" ] && [ -f "$tmp/r1/runs/mine/ckpt-00000150.h5" ] || fail "readme saves"
rm "$tmp/r1/runs/mine/ckpt-00000100.h5"
(cd "$tmp/r1" && "${MPIRUN[@]}" -np 2 "$tmp/readme_build/train" 300) | grep -q "readme_loop: exit 0" || fail "readme 300"
[ ! -f "$tmp/r1/runs/mine/ckpt-00000100.h5" ] || fail "the README loop started over instead of resuming"
(cd "$tmp/r2" && "${MPIRUN[@]}" -np 2 "$tmp/readme_build/train" 300) | grep -q "readme_loop: exit 0" || fail "readme ref"
"$PY" "$src/tests/support/h5ddp_test.py" compare "$tmp/r1/runs/mine/ckpt-00000300.h5" "$tmp/r2/runs/mine/ckpt-00000300.h5" ||
  fail "the README loop resumed differs from the uninterrupted one"
echo "PASS: find_package(h5ddp) consumers: MPI, own_loop kill+resume bitwise, README snippet resume bitwise"

#!/usr/bin/env bash
# Second half of bundle_test.sh, run in its private mount namespace (see there).
set -euo pipefail
bundle=$H5DDP_TEST_BUNDLE src=$H5DDP_TEST_SRC work=$H5DDP_TEST_WORK
fail() { echo "FAIL: $*" >&2; exit 1; }
ma=x86_64-linux-gnu
empty=$work/empty
mkdir -p "$empty"
# 1. Hide every system file of the bundled packages: whole folders they own, then each remaining file.
hidden=0
for d in /usr/include/boost /usr/include/fmt /usr/include/gtest /usr/include/hdf5/openmpi /usr/lib/$ma/openmpi \
  /usr/lib/$ma/pmix2 /usr/lib/$ma/hdf5/openmpi /usr/share/openmpi /etc/openmpi /usr/lib/$ma/cmake/Boost-1.74.0 \
  /usr/lib/$ma/cmake/boost_program_options-1.74.0 /usr/lib/$ma/cmake/fmt /usr/lib/$ma/cmake/GTest; do
  [ -d "$d" ] && mount --bind "$empty" "$d" && hidden=$((hidden + 1))
done
for p in $(grep -v '^#' "$bundle/MANIFEST" | cut -d' ' -f1); do
  while IFS= read -r f; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    case "$f" in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
    [ -s "$f" ] || continue # inside a hidden folder already (or empty)
    mount --bind /dev/null "$f" && hidden=$((hidden + 1))
  done < <(dpkg -L "$p" 2>/dev/null || true)
done
echo "hid $hidden system folders and files of the bundled packages"
[ ! -s /usr/lib/$ma/libhdf5_openmpi.so.103.3.1 ] || fail "the system's parallel HDF5 is still visible"
[ ! -e /usr/include/boost/version.hpp ] || fail "the system's Boost headers are still visible"

# 2. Unpack and point everything at the prefix (what gpu-check.sh --bundle does, the system's copies hidden).
# shellcheck source=../../tools/bundle-env.sh
. "$src/tools/bundle-env.sh" "$bundle" "$work/prefix"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
command -v mpirun | grep -q "^$work/prefix/" || fail "mpirun is not the bundle's: $(command -v mpirun)"
mpirun --version | head -n 1

# 3. Configure and build the torch-free part (unoptimised: this proves finding and linking, not speed).
b=$work/build
cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=None -DH5DDP_USE_PCH=OFF -DH5DDP_BUILD_BENCHMARKS=OFF \
  "${H5DDP_BUNDLE_CMAKE_ARGS[@]}" >"$work/configure.log" 2>&1 || { tail -n 40 "$work/configure.log"; fail "configure"; }
# (CMakeLists.txt itself refuses a serial HDF5.)
for v in MPI_mpi_LIBRARY HDF5_C_COMPILER_EXECUTABLE HDF5_C_LIBRARY_hdf5 HDF5_C_LIBRARY_sz Boost_DIR fmt_DIR GTest_DIR \
  XXHASH_INCLUDE_DIR ZLIB_INCLUDE_DIR; do
  line=$(grep "^$v:" "$b/CMakeCache.txt" || true)
  [ -n "$line" ] || fail "CMake recorded no $v"
  echo "  $line"
  case "$line" in *"=$work/prefix/"*) ;; *) fail "CMake found $v outside the bundle: $line" ;; esac
done
jobs=${H5DDP_BUNDLE_JOBS:-2}
(cd "$b" && make -j"$jobs" h5ddp_checkpoint checkpoint_test h5ddp-env && make -C src/train config.cpp.o) \
  >"$work/build.log" 2>&1 ||
  { grep -E "error|Error" -A3 "$work/build.log" | head -n 40; fail "build"; }
grep -q "boost/program_options.hpp" "$b/src/train/CMakeFiles/h5ddp_train.dir/config.cpp.o.d" 2>/dev/null &&
  ! grep -q " /usr/include/boost/" "$b/src/train/CMakeFiles/h5ddp_train.dir/config.cpp.o.d" ||
  fail "config.cpp did not compile against the bundle's Boost"

# 4. Every library the binaries load comes from the prefix.
for exe in tests/checkpoint/checkpoint_test tools/h5ddp-env; do
  for lib in libmpi.so libhdf5_openmpi.so libfmt.so libopen-pal.so; do
    where=$(ldd "$b/$exe" | awk -v l="$lib" 'index($1, l) == 1 { print $3 }')
    [ -z "$where" ] && continue
    case "$where" in "$work/prefix/"*) ;; *) fail "$exe loads $lib from $where, not from the bundle" ;; esac
  done
done
echo "every libmpi/libhdf5/libfmt/libopen-pal the binaries load is the bundle's"

# 5. Run them with the bundle's mpirun.
mpi=(mpirun --oversubscribe -np 2)
"${mpi[@]}" "$b/tests/checkpoint/checkpoint_test" --gtest_brief=1 >"$work/ckpt.log" 2>&1 ||
  { tail -n 30 "$work/ckpt.log"; fail "checkpoint_test"; }
grep -E "PASSED" "$work/ckpt.log"
"${mpi[@]}" "$b/tools/h5ddp-env" >"$work/env.log" 2>&1 || { tail -n 20 "$work/env.log"; fail "h5ddp-env"; }
tail -n 3 "$work/env.log"
echo "PASS: bundle of $(grep -vc '^#' "$bundle/MANIFEST") packages: configured, built and ran against its prefix alone"

# Sourced (bash), not run: `. tools/bundle-env.sh BUNDLE_DIR PREFIX` unpacks the Debian packages of a GPU bundle
# (tools/gpu-bundle.sh) into PREFIX and points the build and the tests at them (issue 43):
#   - dpkg-deb -x of every .deb (no maintainer scripts, nothing outside PREFIX);
#   - the links Debian's alternatives would have made (mpirun, mpicxx, h5pcc, libmpi.so) and links to libraries
#     the packages expect from the base system (libz.so) made inside PREFIX;
#   - h5pcc's hard-coded prefix rewritten; Open MPI and PMIx relocated (OPAL_PREFIX, PMIX_INSTALL_PREFIX);
#   - PATH and LD_LIBRARY_PATH with PREFIX first; H5DDP_BUNDLE_CMAKE_ARGS (an array) for cmake: every dependency
#     found in PREFIX by an explicit path, not by searching the system.
# H5DDP_BUNDLE_SYSTEM_WINS=1 (tools/gpu-check.sh on the GPU machine): bundled libraries whose soname the machine's
# loader already knows are removed again, so that the machine's own copies win. Returns non-zero naming what failed.
bundle_env() {
  local bundle=$1 prefix=$2 ma=x86_64-linux-gnu deb link target n f
  [ -d "$bundle" ] || { echo "bundle-env: no bundle directory $bundle (make it with tools/gpu-bundle.sh)" >&2; return 1; }
  ls "$bundle"/*.deb >/dev/null 2>&1 || { echo "bundle-env: no .deb in $bundle" >&2; return 1; }
  command -v dpkg-deb >/dev/null 2>&1 || { echo "bundle-env: dpkg-deb not found (needed to unpack $bundle)" >&2; return 1; }
  mkdir -p "$prefix" || return 1
  prefix=$(cd "$prefix" && pwd)
  n=0
  for deb in "$bundle"/*.deb; do
    dpkg-deb -x "$deb" "$prefix" || { echo "bundle-env: cannot unpack $deb" >&2; return 1; }
    n=$((n + 1))
  done
  local usr=$prefix/usr lib=$prefix/usr/lib/$ma
  for t in mpirun mpiexec mpicc mpicxx mpic++ h5pcc; do
    [ -e "$usr/bin/$t.openmpi" ] && ln -sfn "$t.openmpi" "$usr/bin/$t"
  done
  ln -sfn openmpi/lib/libmpi.so "$lib/libmpi.so"
  for f in "$usr"/lib/libpsm1/libpsm_infinipath.so.1.*; do [ -e "$f" ] && ln -sfn "$f" "$lib/libpsm_infinipath.so.1"; done
  local known # the machine's loader cache, read once (pipes from ldconfig into an early-exiting reader fail)
  known=$(/sbin/ldconfig -p 2>/dev/null || true)
  if [ "${H5DDP_BUNDLE_SYSTEM_WINS:-0}" = 1 ]; then
    local f s
    for f in "$lib"/*.so.*; do
      s=$(basename "$f")
      case "$s" in libmpi* | libopen-* | libhdf5* | libboost* | libfmt* | libpmix* | libmca_*) continue ;; esac
      grep -q "^[[:space:]]*$s " <<<"$known" && rm -f "$f"
    done
  fi
  # Absolute links (into the base system): to the machine's copy of that library, by soname.
  while IFS= read -r link; do
    target=$(readlink "$link")
    [ -e "$prefix$target" ] && { ln -sfn "$prefix$target" "$link"; continue; }
    local so base
    base=$(basename "$link")
    so=$(awk -v b="$base." 'index($1, b) == 1 { print $NF; exit }' <<<"$known")
    [ -n "$so" ] && ln -sfn "$so" "$link"
  done < <(find "$prefix" -type l -lname '/*')
  # h5pcc: its prefix, and the bundle's library folder first on its link line (-lsz must not find the system's).
  sed -i -e "s|^prefix=\"/usr\"|prefix=\"$usr\"|" -e "s|^LDFLAGSBASE=\"\"|LDFLAGSBASE=\"-L$lib\"|" "$usr/bin/h5pcc.openmpi"
  # h5pcc links -lcrypto -lcurl -lsz ... even against the shared HDF5: each lib<name>.so it names must exist, as a
  # link to the bundle's runtime library of that name or, failing that, to the machine's.
  local l f
  for l in $(PATH=$usr/bin:$PATH OPAL_PREFIX=$usr h5pcc.openmpi -shlib -show | tr ' ' '\n' | sed -n 's/^-l//p'); do
    [ -e "$lib/lib$l.so" ] && continue
    for f in "$lib/lib$l.so."*; do [ -e "$f" ] && break; f=""; done
    [ -n "$f" ] || f=$(awk -v b="lib$l.so." 'index($1, b) == 1 { print $NF; exit }' <<<"$known")
    [ -n "$f" ] && ln -sfn "$f" "$lib/lib$l.so"
  done
  export OPAL_PREFIX=$usr
  export PMIX_INSTALL_PREFIX=$lib/pmix2
  export PATH=$usr/bin:$PATH
  export LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH} # -lsz and friends of h5pcc: the prefix before /usr/lib
  export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib:$lib/pmix2/lib:$lib/hdf5/openmpi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export H5DDP_BUNDLE_PREFIX=$prefix
  H5DDP_BUNDLE_CMAKE_ARGS=(
    "-DMPI_C_COMPILER=$usr/bin/mpicc.openmpi" "-DMPI_CXX_COMPILER=$usr/bin/mpicxx.openmpi"
    "-DMPIEXEC_EXECUTABLE=$usr/bin/mpirun.openmpi" "-DHDF5_C_COMPILER_EXECUTABLE=$usr/bin/h5pcc.openmpi"
    "-DBoost_DIR=$lib/cmake/Boost-1.74.0" "-Dfmt_DIR=$lib/cmake/fmt" "-DGTest_DIR=$lib/cmake/GTest"
    "-DXXHASH_INCLUDE_DIR=$usr/include" "-DZLIB_INCLUDE_DIR=$usr/include" "-DZLIB_LIBRARY=$lib/libz.so"
  )
  echo "bundle-env: $n packages from $bundle unpacked into $prefix (Open MPI, parallel HDF5, Boost, fmt, GoogleTest)"
}
bundle_env "$@"

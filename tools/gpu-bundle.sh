#!/usr/bin/env bash
# Packs what a bare, offline GPU machine lacks for h5ddp's CUDA build and tests (issue 43): the Debian 12 packages
# of Open MPI, parallel HDF5, Boost.Program_options, fmt, zlib and xxHash headers and their runtime libraries,
# downloaded (apt-get download: nothing is installed here) into an ignored folder with a MANIFEST (package, version,
# bytes, sha256). tools/gpu-check.sh --bundle DIR unpacks them there (dpkg -x into a prefix, never into /).
# The GPU machine brings the rest: CUDA, nvcc, NCCL and LibTorch (its pip torch), CMake, a compiler, a python3
# with numpy, h5py and torch. Fashion-MNIST (dataset-fashion-mnist) comes too: the gpu tests train on it.
#   tools/gpu-bundle.sh [DIR]        (default: gpu-bundle, ignored by git; carry it: device run carry=["gpu-bundle"])
# Exit 1 when a package cannot be downloaded or the bundle would not leave room for the tree in a 64 MiB carry.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
# Build: the -dev packages. Runtime: what they link, beyond a base system (libc6, libstdc++6, libgcc-s1, zlib1g,
# libcurl4, libssl3, libudev1, which any CUDA image has; gpu-check.sh drops every bundled library whose soname the
# machine's loader already knows, so that the machine's own, newer copies win).
packages=(
  openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev
  libpmix2 libhwloc15 libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1
  librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libmunge2 libltdl7 libnuma1 libgfortran5
  libxnvctrl0 libpciaccess0 libjansson4
  libhdf5-openmpi-dev libhdf5-openmpi-103-1 libhdf5-openmpi-hl-100 libhdf5-openmpi-cpp-103-1
  libhdf5-openmpi-hl-cpp-100 libhdf5-openmpi-fortran-102 libhdf5-openmpi-hl-fortran-100 libaec0 libsz2
  libboost1.74-dev libboost-program-options1.74-dev libboost-program-options1.74.0
  libfmt-dev libfmt9 zlib1g-dev libxxhash-dev libgtest-dev libgmock-dev
  dataset-fashion-mnist # the gpu tests train on it (31 MB of the bundle)
)
limit=$((58 << 20)) # the 64 MiB carry also holds the working tree (~3 MiB) and room to grow
mkdir -p "$out"
rm -f "$out"/*.deb "$out/MANIFEST"
(cd "$out" && apt-get -qq download "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
missing=()
for p in "${packages[@]}"; do
  ls "$out/${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu-bundle: could not download: ${missing[*]} (apt-get update? network?)" >&2
  exit 1
fi
{
  echo "# h5ddp GPU bundle: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(. /etc/os-release && echo "$PRETTY_NAME"), made by tools/gpu-bundle.sh"
  echo "# package version bytes sha256"
  for deb in "$out"/*.deb; do
    echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) $(stat -c %s "$deb") $(sha256sum "$deb" | cut -d' ' -f1)"
  done
} >"$out/MANIFEST"
bytes=$(cat "$out"/*.deb | wc -c)
echo "gpu-bundle: ${#packages[@]} packages, $((bytes / 1024 / 1024)) MiB in $out (MANIFEST lists them)"
if [ "$bytes" -gt "$limit" ]; then
  echo "gpu-bundle: $bytes bytes is over the $limit-byte budget for a device carry" >&2
  exit 1
fi

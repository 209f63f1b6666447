#!/usr/bin/env bash
# Installs every Debian package h5ddp needs (only the missing ones), then configures and builds
# (Release) into ${H5DDP_BUILD_DIR:-build} what the main job and a user's tools need: h5ddp-train, h5ddp-ckpt
# and h5ddp-ckpt-torch (its export/import/eval). Idempotent: on a built tree it takes seconds.
#   tools/setup.sh                        install + build the tools
#   H5DDP_TARGETS=all tools/setup.sh      also the library's tests and benchmarks (tools/run-tests.sh does this)
#   H5DDP_WITH_CUDA=ON tools/setup.sh   also build the CUDA/NCCL configuration into build-cuda
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ make cmake pkg-config
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libtorch-dev
  libboost-program-options-dev
  libgtest-dev libbenchmark-dev
  libfmt-dev libxxhash-dev zlib1g-dev
  dataset-fashion-mnist fortunes
  python3-torch python3-h5py
  python3-mpi4py python3-h5py-mpi python3-xxhash
  clang-14 libclang-rt-14-dev libfuzzer-14-dev clang-format
  slurm-wlm munge
  strace gnuplot-nox
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
fi

build="${H5DDP_BUILD_DIR:-build}"
jobs="${H5DDP_JOBS:-$(nproc)}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
fi
# shellcheck disable=SC2206 # a list of target names
targets=(${H5DDP_TARGETS:-h5ddp-train h5ddp-ckpt h5ddp-ckpt-torch})
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

if [ "${H5DDP_WITH_CUDA:-OFF}" = "ON" ]; then
  if [ ! -f build-cuda/CMakeCache.txt ]; then
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DH5DDP_WITH_CUDA=ON -DH5DDP_BUILD_BENCHMARKS=OFF
  fi
  # Compile and link only (no GPU here): every library of the CUDA configuration (the NCCL backend, the CUDA paths
  # of device, DDP and checkpoint code), the tools the gpu-labelled tests run, and the test programs with CUDA
  # code (tools/gpu-check.sh builds and runs those on a GPU machine). The other test programs are the CPU build's
  # code compiled again; H5DDP_CUDA_TARGETS=all builds them too. Benchmarks are the CPU build's.
  targets=(${H5DDP_CUDA_TARGETS:-h5ddp-train h5ddp-ckpt h5ddp-ckpt-torch comm_test nccl_comm_test ddp_test})
  if [ "${targets[*]}" = all ]; then targets=(all); fi
  cmake --build build-cuda -j "$jobs" --target "${targets[@]}"
fi
echo "setup: built in $build"

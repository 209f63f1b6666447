#!/usr/bin/env bash
# The GPU bundle is complete (issue 43): what tools/gpu-check.sh --bundle will do on a bare GPU machine, done here
# up to the first CUDA call. tools/gpu-bundle.sh downloads the packages (or H5DDP_GPU_BUNDLE names a folder of
# them); in a private mount namespace every system file of those packages is hidden (an empty file or folder
# bound over it), tools/bundle-env.sh unpacks the bundle into a prefix, and the CPU configuration is configured
# against the prefix alone and the torch-free part of the tree built: the libraries (MPI, parallel HDF5, fmt,
# xxHash, zlib), h5ddp-env, the checkpoint tests (GoogleTest), and config.cpp (Boost); then the bundle's mpirun runs
# them at 2 ranks. Every dependency CMake found
# and every library the binaries load must come from the prefix. LibTorch is not in the bundle (the GPU machine
# brings its own), so the LibTorch translation units are not built here: they would add 15 minutes and nothing
# the bundle provides.
#   bundle_test.sh SOURCE_DIR          env: H5DDP_GPU_BUNDLE (a made bundle), H5DDP_BUNDLE_JOBS (2)
set -euo pipefail
src=$(cd "${1:?source dir}" && pwd)
if [ "$(id -u)" -ne 0 ] || ! unshare --mount true 2>/dev/null; then
  echo "SKIP: needs root and unshare --mount to hide the system's copies of the bundled packages"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-bundle-XXXXXX")
trap 'rm -rf "$work"' EXIT
bundle=${H5DDP_GPU_BUNDLE:-}
if [ -z "$bundle" ]; then
  # No package mirror (an offline machine) is a skip; a package the mirror lacks is a failure (gpu-bundle.sh's).
  mkdir -p "$work/probe"
  if ! (cd "$work/probe" && apt-get -qq download libxxhash-dev >/dev/null 2>&1); then
    echo "SKIP: apt-get download reaches no package mirror here (run apt-get update, or set H5DDP_GPU_BUNDLE)"
    exit 77
  fi
  bundle=$work/bundle
  bash "$src/tools/gpu-bundle.sh" "$bundle"
fi
export H5DDP_TEST_BUNDLE=$bundle H5DDP_TEST_SRC=$src H5DDP_TEST_WORK=$work
unshare --mount --propagation private bash "$src/tests/bundle/bundle_inside.sh"

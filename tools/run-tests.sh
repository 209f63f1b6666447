#!/usr/bin/env bash
# The whole test suite: setup (install + build of every target, the CUDA configuration too when CUDA is present),
# then every ctest test that can run on this machine (the `gpu` label needs a GPU and is excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d /usr/local/cuda ] && [ -z "${H5DDP_WITH_CUDA:-}" ]; then export H5DDP_WITH_CUDA=ON; fi
H5DDP_TARGETS=all tools/setup.sh
export OMP_NUM_THREADS=1
cd "${H5DDP_BUILD_DIR:-build}"
ctest -LE gpu --output-on-failure --timeout 900 -j "${H5DDP_TEST_JOBS:-2}" "$@"

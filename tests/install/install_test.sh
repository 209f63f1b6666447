#!/usr/bin/env bash
# cmake --install into a temporary prefix, then build and run a downstream project that uses find_package(h5ddp).
set -euo pipefail
bin="${H5DDP_BINARY_DIR:?}"; src="${H5DDP_SOURCE_DIR:?}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$bin" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/include/h5ddp/mpi_env.hpp"
cmake -S "$src/tests/install/consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/build" -j2 >/dev/null
out=$(LD_LIBRARY_PATH="$tmp/prefix/lib:${LD_LIBRARY_PATH:-}" mpirun --oversubscribe -np 2 "$tmp/build/consumer")
echo "$out"
grep -q "consumer: size=2 sum=3 OK" <<<"$out"

// Shared helpers for MPI tests: the world communicator and scratch directories every rank agrees on
// (tests/support: the C++ test support library, h5ddp_test_support).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "h5ddp/mpi_comm.hpp"

namespace h5ddp::test {

// A communicator over MPI_COMM_WORLD shared by the tests of one binary.
MpiComm& world();

// Collective: a fresh empty directory (same path on every rank), under $TMPDIR or /tmp.
std::string scratch_dir(const std::string& tag);

// n pseudo-random bytes (xorshift64 from `seed`): file contents whose every byte position tells a misplaced copy.
std::vector<char> pattern_bytes(size_t n, uint64_t seed);
// Writes `bytes` to dir/name; returns the path.
std::string write_bytes(const std::string& dir, const std::string& name, const std::vector<char>& bytes);

}  // namespace h5ddp::test

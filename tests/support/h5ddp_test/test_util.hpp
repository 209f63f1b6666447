// Shared helpers for MPI tests: the world communicator and scratch directories every rank agrees on
// (tests/support: the C++ test support library, h5ddp_test_support).
#pragma once

#include <string>

#include "h5ddp/mpi_comm.hpp"

namespace h5ddp::test {

// A communicator over MPI_COMM_WORLD shared by the tests of one binary.
MpiComm& world();

// Collective: a fresh empty directory (same path on every rank), under $TMPDIR or /tmp.
std::string scratch_dir(const std::string& tag);

}  // namespace h5ddp::test

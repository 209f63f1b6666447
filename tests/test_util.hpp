// Shared helpers for MPI tests: the world communicator and scratch directories every rank agrees on.
#pragma once

#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "h5ddp/mpi_comm.hpp"

namespace h5ddp::test {

// A communicator over MPI_COMM_WORLD shared by the tests of one binary.
inline MpiComm& world() {
  static std::unique_ptr<MpiComm> c = MpiComm::dup(MPI_COMM_WORLD);
  return *c;
}

// Collective: a fresh empty directory (same path on every rank), under $TMPDIR or /tmp.
inline std::string scratch_dir(const std::string& tag) {
  auto& c = world();
  std::string path;
  if (c.rank() == 0) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/h5ddp-" + tag + "-XXXXXX";
    char* made = mkdtemp(tmpl.data());
    path = made ? made : "";
  }
  path = c.broadcast_string(path, 0);
  return path;
}

}  // namespace h5ddp::test

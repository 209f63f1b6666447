#include "h5ddp_test/test_util.hpp"

#include <mpi.h>
#include <stdlib.h>

#include <cstdlib>
#include <memory>

namespace h5ddp::test {

MpiComm& world() {
  static std::unique_ptr<MpiComm> c = MpiComm::dup(MPI_COMM_WORLD);
  return *c;
}

std::string scratch_dir(const std::string& tag) {
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

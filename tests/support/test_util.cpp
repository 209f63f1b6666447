#include "h5ddp_test/test_util.hpp"

#include <mpi.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
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

std::vector<char> pattern_bytes(size_t n, uint64_t seed) {
  std::vector<char> v(n);
  uint64_t x = seed;
  for (auto& c : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  return v;
}

std::string write_bytes(const std::string& dir, const std::string& name, const std::vector<char>& bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace h5ddp::test

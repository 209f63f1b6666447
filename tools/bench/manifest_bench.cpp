// h5ddp-bench-manifest FILE [ROUNDS]: what the rules of docs/FORMAT.md cost a load, per dataset. Alternates, in
// one process on one open file, the manifest as listed without checks (read_manifest_from: what a load read
// before issue 45) and the manifest of one walk of every object and attribute checked against the rules
// (read_valid_manifest: what a load reads now); prints the median of each and their ratio.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint/reader.hpp"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: h5ddp-bench-manifest FILE [ROUNDS]\n");
    return 2;
  }
  MPI_Init(&argc, &argv);
  const std::string path = argv[1];
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 7;
  std::vector<double> plain, checked;
  size_t datasets = 0;
  {
    h5ddp::h5::Handle f = h5ddp::ckpt::open_checkpoint(nullptr, path);
    for (int r = 0; r < rounds; ++r) {  // alternating, so that drift on a busy machine hits both alike
      plain.push_back(seconds([&] { h5ddp::ckpt::read_manifest_from(f, path); }));
      checked.push_back(seconds([&] {
        const auto m = h5ddp::ckpt::read_valid_manifest(f, path);
        datasets = m.model.size() + m.optimizer_state.size() + m.user.size();
      }));
    }
  }
  const double p = median(plain), c = median(checked);
  std::printf(
      "RESULT file=%s tensors=%zu rounds=%d listed_s=%.4f checked_s=%.4f listed_us_per_tensor=%.1f "
      "checked_us_per_tensor=%.1f ratio=%.2f\n",
      path.c_str(), datasets, rounds, p, c, 1e6 * p / datasets, 1e6 * c / datasets, c / p);
  MPI_Finalize();
  return 0;
}

// h5ddp-ckpt diff A B: per-dataset max absolute and relative difference, datasets only in one file, verdict.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "ckpt/subcommands.hpp"
#include "h5ddp/checkpoint.hpp"

namespace h5ddp::ckpt_tool {

int run_diff(const Args& args) {
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: h5ddp-ckpt diff A B\n");
    return 2;
  }
  CheckpointFile a(args[0]), b(args[1]);
  std::map<std::string, TensorInfo> in_b;
  for (const auto& d : b.datasets()) in_b[d.name] = d;
  int differences = 0;
  std::printf("%-56s %14s %14s\n", "dataset", "max abs diff", "max rel diff");
  for (const auto& da : a.datasets()) {
    auto it = in_b.find(da.name);
    if (it == in_b.end()) {
      std::printf("%-56s only in A\n", da.name.c_str());
      ++differences;
      continue;
    }
    const TensorInfo db = it->second;
    in_b.erase(it);
    if (da.dtype != db.dtype || da.shape != db.shape) {
      std::printf("%-56s dtype/shape differ: %s vs %s\n", da.name.c_str(), dtype_name(da.dtype), dtype_name(db.dtype));
      ++differences;
      continue;
    }
    const auto xa = a.read(da.name), xb = b.read(db.name);
    if (xa == xb) continue;  // bytes decide, not checksums
    double max_abs = 0, max_rel = 0;
    const size_t n = xa.size() / dtype_size(da.dtype);
    for (size_t i = 0; i < n; ++i) {
      const double va = element_as_double(xa.data(), da.dtype, i), vb = element_as_double(xb.data(), db.dtype, i);
      const double abs = std::fabs(va - vb);
      if (std::isnan(abs)) {
        if (std::isnan(va) != std::isnan(vb)) max_abs = max_rel = NAN;
        continue;
      }
      const double scale = std::max(std::fabs(va), std::fabs(vb));
      max_abs = std::max(max_abs, abs);
      if (scale > 0) max_rel = std::max(max_rel, abs / scale);
    }
    std::printf("%-56s %14.6g %14.6g\n", da.name.c_str(), max_abs, max_rel);
    ++differences;
  }
  for (const auto& [name, d] : in_b) {
    std::printf("%-56s only in B\n", name.c_str());
    ++differences;
  }
  if (differences == 0) {
    std::printf("identical: every dataset has the same dtype, shape and bytes\n");
    return 0;
  }
  std::printf("differ: %d dataset(s) differ or exist in one file only\n", differences);
  return 1;
}

}  // namespace h5ddp::ckpt_tool

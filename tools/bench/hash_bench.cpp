// h5ddp-bench-hash: the XXH3 kernels this CPU runs (ckpt::hash_kernels), side by side in one run, on the two
// access patterns checkpoints have: a large range hashed once (cold: save's background hasher) and pieces
// hashed right after they were written into memory (hot: load and verify hash each piece they just read).
//   h5ddp-bench-hash [--gib G] [--piece-kib K] [--reps R]
// Prints "RESULT kernel=... pattern=... seconds_per_gib=..." (kernels alternating each repetition): "cold" is
// the best of R; "after_copy" is the median over repetitions of (copy and hash) - (copy alone), measured back
// to back. Checks that every kernel gave the same hash.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/hash.hpp"

using namespace h5ddp;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  double gib = 1.0;
  size_t piece = 4u << 20;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--gib")
      gib = std::stod(v);
    else if (k == "--piece-kib")
      piece = std::stoul(v) << 10;
    else if (k == "--reps")
      reps = std::max(1, std::stoi(v));
    else
      return std::fprintf(stderr, "unknown option %s\n", k.c_str()), 2;
  }
  const size_t n = static_cast<size_t>(gib * (1ull << 30)) / piece * piece;
  std::vector<uint8_t> src(n), dst(n);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(src.data() + i, &x, 8);
  }
  std::memcpy(dst.data(), src.data(), n);  // every page touched before timing
  const auto kernels = ckpt::hash_kernels();
  std::map<std::string, std::map<std::string, double>> best;
  std::map<std::string, uint64_t> hashes;
  std::map<std::string, std::vector<double>> diffs;
  auto time = [](auto f) {
    const auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t j = 0; j < kernels.size(); ++j) {
      const std::string& k = kernels[(j + rep) % kernels.size()];  // the first kernel changes every repetition
      uint64_t h = 0;
      const double cold = time([&] { h = ckpt::hash_bytes_with(k, src.data(), n); });
      // Copy a piece (as a read does), then hash it while it is in the cache; minus the copies alone.
      const double copy = time([&] {
        for (size_t o = 0; o < n; o += piece) std::memcpy(dst.data() + o, src.data() + o, piece);
      });
      uint64_t hot_hash = 0;
      const double copy_hash = time([&] {
        ckpt::StreamHash st(k);
        for (size_t o = 0; o < n; o += piece) {
          std::memcpy(dst.data() + o, src.data() + o, piece);
          st.update(dst.data() + o, piece);
        }
        hot_hash = st.digest();
      });
      if (hot_hash != h) return std::fprintf(stderr, "%s: streamed hash differs from one-shot\n", k.c_str()), 1;
      if (!hashes.count(k)) hashes[k] = h;
      auto& b = best[k]["cold"];
      b = b == 0 ? cold : std::min(b, cold);
      diffs[k].push_back(copy_hash - copy);
    }
  }
  for (const auto& [k, h] : hashes)
    if (h != hashes.begin()->second) return std::fprintf(stderr, "kernel %s gives another hash\n", k.c_str()), 1;
  for (const auto& k : kernels) {
    auto& d = diffs[k];
    std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
    best[k]["after_copy"] = d[d.size() / 2];
  }
  for (const auto& k : kernels)
    for (const auto& [pattern, s] : best[k])
      std::printf("RESULT kernel=%s pattern=%s piece_kib=%zu seconds_per_gib=%.4f%s\n", k.c_str(), pattern.c_str(),
                  piece >> 10, s / (n / double(1ull << 30)), k == ckpt::hash_kernel() ? " (default choice)" : "");
  return 0;
}

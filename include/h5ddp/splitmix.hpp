// splitmix64 (Steele, Lea, Flood 2014): a tiny, well-mixed generator with a fixed definition, the same on every
// platform. The sampler's permutations and the RNG streams derived for ranks that a checkpoint did not have are
// drawn from it, so both are reproducible bit for bit.
#pragma once

#include <cstdint>

namespace h5ddp {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [0, bound) without modulo bias (rejection sampling); bound > 0.
  uint64_t below(uint64_t bound);

 private:
  uint64_t state_;
};

// Mixes two words into one seed (used for per-epoch and per-rank derived streams).
uint64_t mix_seed(uint64_t a, uint64_t b);

}  // namespace h5ddp

#include "h5ddp/splitmix.hpp"

#include <cstdint>

namespace h5ddp {

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::below(uint64_t bound) {
  // Accept only draws below the largest multiple of bound, so every residue is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do x = next();
  while (x >= limit);
  return x % bound;
}

uint64_t mix_seed(uint64_t a, uint64_t b) {
  SplitMix64 g(a ^ (b * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull));
  g.next();
  return g.next();
}

}  // namespace h5ddp

// The distributed sampler: a fixed, platform-independent shuffle; the same global batches at every world
// size; every sample once per epoch; resume from a position continues exactly.
#include "h5ddp/sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

TEST(Sampler, SplitMix64MatchesTheReferenceSequence) {
  // Reference outputs of splitmix64 seeded with 0 (Vigna's splitmix64.c).
  SplitMix64 g(0);
  EXPECT_EQ(g.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(g.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(g.next(), 0x06C45D188009454Full);
}

TEST(Sampler, ShuffleIsAPermutationFixedByEpochAndSeed) {
  const auto p0 = shuffled_indices(1000, 7, 0);
  auto sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(p0, iota);
  EXPECT_EQ(p0, shuffled_indices(1000, 7, 0));
  EXPECT_NE(p0, shuffled_indices(1000, 7, 1));
  EXPECT_NE(p0, shuffled_indices(1000, 8, 0));
}

TEST(Sampler, EverySampleOncePerEpochAndTheSameGlobalBatchesAtAnyWorldSize) {
  const int64_t n = 1000, g = 40;  // 25 full batches
  for (int64_t epoch : {0, 3}) {
    std::vector<std::vector<int64_t>> reference;  // global batches at world size 1
    for (int world : {1, 2, 4, 8}) {
      std::vector<DistributedSampler> ranks;
      for (int r = 0; r < world; ++r) ranks.emplace_back(n, g, 42, world, r);
      std::multiset<int64_t> seen;
      int step = 0;
      for (int64_t pos = 0; ranks[0].has_batch(pos); pos += g, ++step) {
        std::vector<int64_t> global;
        for (int r = 0; r < world; ++r) {
          const auto local = ranks[r].local_indices(epoch, pos);
          ASSERT_EQ(int64_t(local.size()), g / world);
          global.insert(global.end(), local.begin(), local.end());
        }
        EXPECT_EQ(global, ranks[0].global_indices(epoch, pos));
        if (world == 1)
          reference.push_back(global);
        else
          EXPECT_EQ(global, reference.at(step)) << "world " << world << " step " << step;
        seen.insert(global.begin(), global.end());
      }
      EXPECT_EQ(step, 25);
      EXPECT_EQ(seen.size(), size_t(n));
      EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), size_t(n)) << "a sample repeated";
    }
  }
}

TEST(Sampler, RemainderIsDroppedNeverRepeated) {
  DistributedSampler s(103, 10, 1, 2, 0);
  EXPECT_EQ(s.steps_per_epoch(), 10);
  EXPECT_EQ(s.samples_per_epoch(), 100);
  EXPECT_TRUE(s.has_batch(90));
  EXPECT_FALSE(s.has_batch(100));
  std::set<int64_t> seen;
  for (int64_t pos = 0; s.has_batch(pos); pos += 10) {
    const auto b = s.global_indices(0, pos);
    seen.insert(b.begin(), b.end());
  }
  EXPECT_EQ(seen.size(), 100u);
  // The dropped samples are exactly the tail of the permutation.
  const auto perm = shuffled_indices(103, 1, 0);
  for (int i = 100; i < 103; ++i) EXPECT_EQ(seen.count(perm[i]), 0u);
  EXPECT_THROW(s.local_indices(0, 100), Error);
}

TEST(Sampler, ResumeFromAnyPositionContinuesWithTheNextSample) {
  const int64_t n = 600, g = 24;
  DistributedSampler whole(n, g, 5, 1, 0);
  std::vector<int64_t> uninterrupted;
  for (int64_t pos = 0; whole.has_batch(pos); pos += g) {
    const auto b = whole.global_indices(1, pos);
    uninterrupted.insert(uninterrupted.end(), b.begin(), b.end());
  }
  for (int64_t p : {g * 3, g * 17}) {
    for (int world : {1, 2, 4}) {
      // A new sampler (fresh process) at another world size, resumed at position p.
      std::vector<int64_t> resumed;
      for (int64_t pos = p; pos + g <= n; pos += g)
        for (int r = 0; r < world; ++r) {
          DistributedSampler s(n, g, 5, world, r);
          const auto local = s.local_indices(1, pos);
          resumed.insert(resumed.end(), local.begin(), local.end());
        }
      EXPECT_EQ(resumed, std::vector<int64_t>(uninterrupted.begin() + p, uninterrupted.end()))
          << "position " << p << " world " << world;
    }
  }
}

TEST(Sampler, RejectsBadBatchSizes) {
  EXPECT_THROW(DistributedSampler(100, 0, 1, 1, 0), ConfigError);
  EXPECT_THROW(DistributedSampler(100, -4, 1, 1, 0), ConfigError);
  EXPECT_THROW(DistributedSampler(100, 10, 1, 4, 0), ConfigError);  // 10 not divisible by 4
  EXPECT_THROW(DistributedSampler(100, 200, 1, 1, 0), ConfigError);
  EXPECT_THROW(DistributedSampler(100, 10, 1, 2, 2), ConfigError);
  try {
    DistributedSampler(100, 10, 1, 4, 0);
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("divisible"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace h5ddp

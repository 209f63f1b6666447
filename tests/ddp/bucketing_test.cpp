// assign_buckets is pure: these tests need no communication (they run as a 1-rank MPI test binary).
#include "h5ddp/bucketing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace h5ddp {
namespace {

void expect_each_index_once(const std::vector<BucketSpec>& buckets, size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& b : buckets)
    for (size_t i : b.params) {
      ASSERT_LT(i, n);
      ++seen[i];
    }
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "index " << i;
}

TEST(Bucketing, ReverseOrderAndCaps) {
  // 10 tensors of 300 bytes, one key, first bucket 500 bytes, cap 1000 bytes.
  std::vector<size_t> nbytes(10, 300);
  std::vector<int> key(10, 0);
  auto b = assign_buckets(nbytes, key, 500, 1000);
  expect_each_index_once(b, 10);
  ASSERT_GE(b.size(), 2u);
  // Reverse registration order: the first bucket starts with the last tensor, and indices fall throughout.
  EXPECT_EQ(b.front().params.front(), 9u);
  std::vector<size_t> flat;
  for (const auto& s : b) flat.insert(flat.end(), s.params.begin(), s.params.end());
  EXPECT_TRUE(std::is_sorted(flat.rbegin(), flat.rend()));
  // The first bucket is small: one 300-byte tensor (two would exceed 500).
  EXPECT_EQ(b.front().params.size(), 1u);
  EXPECT_EQ(b.front().bytes, 300u);
  for (size_t k = 1; k < b.size(); ++k) EXPECT_LE(b[k].bytes, 1000u);
  // Later buckets are filled up to the cap: 3 x 300 = 900 (a fourth would exceed 1000).
  EXPECT_EQ(b[1].params.size(), 3u);
  size_t total = 0;
  for (const auto& s : b) {
    size_t sum = 0;
    for (size_t i : s.params) sum += nbytes[i];
    EXPECT_EQ(sum, s.bytes);
    total += s.bytes;
  }
  EXPECT_EQ(total, 3000u);
}

TEST(Bucketing, OversizedTensorGetsItsOwnBucket) {
  std::vector<size_t> nbytes = {100, 5000, 100, 100};
  std::vector<int> key(4, 0);
  auto b = assign_buckets(nbytes, key, 150, 1000);
  expect_each_index_once(b, 4);
  for (const auto& s : b) {
    if (s.bytes > 1000) {
      EXPECT_EQ(s.params.size(), 1u);
      EXPECT_EQ(s.params.front(), 1u);
    }
  }
}

TEST(Bucketing, NeverMixesKeysAndKeepsFirstSmallPerKey) {
  // Interleaved float32 (key 0) and float64 (key 1) tensors.
  std::vector<size_t> nbytes;
  std::vector<int> key;
  for (int i = 0; i < 40; ++i) {
    nbytes.push_back(64 + 16 * (i % 5));
    key.push_back(i % 3 == 0 ? 1 : 0);
  }
  auto b = assign_buckets(nbytes, key, 200, 600);
  expect_each_index_once(b, nbytes.size());
  std::set<int> first_seen;
  for (const auto& s : b) {
    const int k = key[s.params.front()];
    for (size_t i : s.params) EXPECT_EQ(key[i], k) << "bucket mixes keys";
    const size_t limit = first_seen.count(k) ? 600 : 200;
    if (s.params.size() > 1) {
      EXPECT_LE(s.bytes, limit);
    }
    first_seen.insert(k);
  }
  EXPECT_EQ(first_seen.size(), 2u);
  // Launch order follows the reversed list: each bucket's first tensor comes before the next bucket's.
  for (size_t k = 1; k < b.size(); ++k) EXPECT_GT(b[k - 1].params.front(), b[k].params.front());
}

TEST(Bucketing, DefaultsAndEdgeCases) {
  EXPECT_EQ(kFirstBucketBytes, size_t{1} << 20);
  EXPECT_EQ(kBucketBytesCap, size_t{25} << 20);
  EXPECT_TRUE(assign_buckets({}, {}).empty());
  // Zero-byte tensors still get a place.
  auto z = assign_buckets({0, 0, 4}, {0, 0, 0});
  expect_each_index_once(z, 3);
  // A 50M-parameter float32 MLP layout: 64 MiB weights exceed the cap and stand alone.
  std::vector<size_t> mlp = {784 * 4096 * 4,  4096 * 4, 4096 * 4096 * 4, 4096 * 4,
                             4096 * 4096 * 4, 4096 * 4, 4096 * 10 * 4,   10 * 4};
  auto m = assign_buckets(mlp, std::vector<int>(mlp.size(), 0));
  expect_each_index_once(m, mlp.size());
  EXPECT_LE(m.front().bytes, kFirstBucketBytes);
  EXPECT_THROW(assign_buckets({1, 2}, {0}), std::exception);
}

// Whole tensors, largest first onto the least loaded rank (lowest on a tie): deterministic and balanced.
TEST(Shards, LargestFirstOntoLeastLoadedRank) {
  EXPECT_EQ(assign_shards({100, 10, 60, 50, 0}, 2), (std::vector<int>{0, 0, 1, 1, 0}));
  EXPECT_EQ(assign_shards({4, 4, 4, 4}, 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(assign_shards({4, 4}, 3), (std::vector<int>{0, 1}));  // rank 2 owns nothing
  EXPECT_EQ(assign_shards({7, 3, 9}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_TRUE(assign_shards({}, 4).empty());
  // 8 layers of a 4-rank MLP: every rank ends with the same bytes.
  const std::vector<size_t> mlp = {4000, 40, 4000, 40, 4000, 40, 4000, 40};
  std::vector<size_t> load(4, 0);
  const auto owner = assign_shards(mlp, 4);
  for (size_t i = 0; i < mlp.size(); ++i) load[owner[i]] += mlp[i];
  EXPECT_EQ(*std::max_element(load.begin(), load.end()), *std::min_element(load.begin(), load.end()));
}

}  // namespace
}  // namespace h5ddp

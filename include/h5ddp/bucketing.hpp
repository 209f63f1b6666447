// Gradient bucket assignment for DistributedDataParallel: a pure function, tested without communication
// (the shape of c10d's compute_bucket_assignment_by_size). Needs no LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace h5ddp {

// The first bucket is small so its allreduce starts early in backward; later ones are capped so that
// communication starts before backward ends while each message is still large enough to be efficient.
constexpr size_t kFirstBucketBytes = size_t{1} << 20;
constexpr size_t kBucketBytesCap = size_t{25} << 20;

struct BucketSpec {
  std::vector<size_t> params;  // indices into the input list, in the order their gradients should be ready
  size_t bytes = 0;            // sum of the params' byte sizes
};

// Assigns tensors (given in parameter registration order) to buckets. Tensors are taken in REVERSE order,
// since gradients become ready roughly back to front, and a bucket never mixes tensors of different
// `group_key` (dtype/device). Per key, the first bucket holds at most `first_bucket_bytes`, later ones at
// most `bucket_cap_bytes`; a bucket exceeds its limit only when it holds one tensor larger than the limit.
// Buckets are returned in launch order: ordered by the position of their first tensor in the reversed
// list. Every index appears in exactly one bucket; zero-byte tensors still get a place. Pure, not collective.
std::vector<BucketSpec> assign_buckets(const std::vector<size_t>& nbytes, const std::vector<int>& group_key,
                                       size_t first_bucket_bytes = kFirstBucketBytes,
                                       size_t bucket_cap_bytes = kBucketBytesCap);

// Optimizer sharding (ZeRO-1): the rank that owns each tensor's optimizer state. Whole tensors, largest
// first, each to the rank with the fewest bytes so far (the lowest such rank on a tie), so the same sizes and
// world always give the same owners. Ranks may own nothing when there are fewer tensors than ranks. Pure.
std::vector<int> assign_shards(const std::vector<size_t>& nbytes, int world);

// Element-range sharding (ZeRO-1/2, DdpOptions::shard): where one bucket's flattened elements are cut between
// `world` ranks. The bucket holds tensors of numel[k] elements in rows of row_numel[k] elements (the product of
// the dimensions after the first; 1 for vectors and scalars). Rank r owns elements [cuts[r], cuts[r + 1]) of
// the bucket: each cut is r * total / world moved to the nearest row boundary of the tensor it falls in, so a
// tensor splits between rows only (a row is the alignment unit), shares differ by at most a row of a split
// tensor, and a rank owns nothing only when the bucket has fewer rows than ranks. Pure.
std::vector<int64_t> split_bucket(const std::vector<int64_t>& numel, const std::vector<int64_t>& row_numel, int world);

}  // namespace h5ddp

#include "h5ddp/sampler.hpp"

#include <string>

#include "h5ddp/error.hpp"

namespace h5ddp {

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 g(mix_seed(seed, static_cast<uint64_t>(epoch)));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(g.below(static_cast<uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

void check_global_batch(int64_t global_batch, int world_size) {
  if (global_batch <= 0)
    throw ConfigError("--batch-size must be positive (it is the GLOBAL batch over all ranks), got " +
                      std::to_string(global_batch));
  if (global_batch % world_size != 0)
    throw ConfigError("--batch-size " + std::to_string(global_batch) + " (global) is not divisible by the " +
                      std::to_string(world_size) + " ranks; use a multiple of " + std::to_string(world_size));
}

DistributedSampler::DistributedSampler(int64_t num_samples, int64_t global_batch, uint64_t seed, int world_size,
                                       int rank)
    : num_samples_(num_samples), global_batch_(global_batch), seed_(seed), world_size_(world_size), rank_(rank) {
  if (world_size <= 0 || rank < 0 || rank >= world_size)
    throw ConfigError("sampler: rank " + std::to_string(rank) + " not in a world of " + std::to_string(world_size));
  check_global_batch(global_batch, world_size);
  if (global_batch > num_samples)
    throw ConfigError("--batch-size " + std::to_string(global_batch) + " exceeds the " + std::to_string(num_samples) +
                      " training samples");
}

const std::vector<int64_t>& DistributedSampler::perm(int64_t epoch) {
  if (epoch != cached_epoch_) {
    perm_ = shuffled_indices(num_samples_, seed_, epoch);
    cached_epoch_ = epoch;
  }
  return perm_;
}

void DistributedSampler::check_position(int64_t position) const {
  H5DDP_CHECK(position >= 0 && position + global_batch_ <= num_samples_,
              "sampler position " + std::to_string(position) + " leaves no full global batch of " +
                  std::to_string(global_batch_) + " in an epoch of " + std::to_string(num_samples_) + " samples");
}

std::vector<int64_t> DistributedSampler::local_indices(int64_t epoch, int64_t position) {
  check_position(position);
  const auto& p = perm(epoch);
  const int64_t begin = position + rank_ * local_batch();
  return std::vector<int64_t>(p.begin() + begin, p.begin() + begin + local_batch());
}

std::vector<int64_t> DistributedSampler::global_indices(int64_t epoch, int64_t position) {
  check_position(position);
  const auto& p = perm(epoch);
  return std::vector<int64_t>(p.begin() + position, p.begin() + position + global_batch_);
}

bool DistributedSampler::advance(DataState& data) const {
  data.position += global_batch_;
  if (has_batch(data.position)) return false;
  ++data.epoch;
  data.position = 0;
  return true;
}

}  // namespace h5ddp

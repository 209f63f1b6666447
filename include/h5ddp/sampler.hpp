// Distributed sampler over a global index space [0, num_samples).
//
// Epoch e visits perm_e, a Fisher-Yates shuffle driven by splitmix64 seeded from (seed, e), so the
// order is the same on every platform and at every world size. Global batch k is
// perm_e[k*G, (k+1)*G) with G the global batch size; rank r of N takes the contiguous slice
// [r*G/N, (r+1)*G/N) of it. The position inside an epoch is counted in global samples, so a run
// saved at N ranks resumes at M ranks on exactly the next sample. The last num_samples % G samples
// of a shuffled epoch are dropped (every optimizer step sees exactly G samples).
#pragma once

#include <cstdint>
#include <vector>

#include "h5ddp/splitmix.hpp"  // the generator of the permutations
#include "h5ddp/train_state.hpp"

namespace h5ddp {

// Local. The permutation of [0, n) for (seed, epoch).
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch);

// Local. Throws ConfigError unless global_batch is positive and divisible by world_size (each rank takes
// global_batch / world_size samples a step). Needs no data: callers check it before any I/O.
void check_global_batch(int64_t global_batch, int world_size);

class DistributedSampler {
 public:
  // Local. Throws ConfigError if global_batch <= 0, global_batch % world_size != 0, global_batch > num_samples,
  // or rank is not in [0, world_size).
  DistributedSampler(int64_t num_samples, int64_t global_batch, uint64_t seed, int world_size, int rank);

  int64_t num_samples() const { return num_samples_; }
  int64_t global_batch() const { return global_batch_; }
  int64_t local_batch() const { return global_batch_ / world_size_; }
  // Optimizer steps in one epoch (num_samples / global_batch, remainder dropped).
  int64_t steps_per_epoch() const { return num_samples_ / global_batch_; }
  // Samples of an epoch that are used: steps_per_epoch() * global_batch().
  int64_t samples_per_epoch() const { return steps_per_epoch() * global_batch_; }

  // True if a full global batch starts at `position` (global samples consumed in the epoch).
  bool has_batch(int64_t position) const { return position >= 0 && position + global_batch_ <= num_samples_; }
  // This rank's indices of the global batch perm_epoch[position, position + G); needs has_batch(position).
  // Any position works, not only multiples of G, so a resume with another global batch neither replays nor skips.
  std::vector<int64_t> local_indices(int64_t epoch, int64_t position);
  // Local. After an optimizer step: moves data.position past one global batch, to the next epoch (position 0)
  // when no full batch is left (the rest of the permutation is dropped). Returns true when an epoch ended.
  bool advance(DataState& data) const;
  // All indices of that global batch (every rank's slices, in rank order).
  std::vector<int64_t> global_indices(int64_t epoch, int64_t position);

 private:
  const std::vector<int64_t>& perm(int64_t epoch);
  void check_position(int64_t position) const;

  int64_t num_samples_, global_batch_;
  uint64_t seed_;
  int world_size_, rank_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace h5ddp

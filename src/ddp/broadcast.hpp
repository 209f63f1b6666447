// Internal to the ddp layer: tensors broadcast from one rank, coalesced.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "h5ddp/comm.hpp"

namespace h5ddp {

// Broadcasts tensors from `root` through `comm`, coalesced into flat buffers of at most `chunk_bytes` per
// dtype and device, so a model with hundreds of small tensors costs a few broadcasts. Collective.
void broadcast_coalesced(Comm& host, Comm* device, const std::vector<torch::Tensor>& tensors, int root,
                         size_t chunk_bytes);

}  // namespace h5ddp

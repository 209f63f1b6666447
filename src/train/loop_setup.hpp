// h5ddp-train's options as the library's objects: the optimizer and the Checkpointer options
// an adopter's own loop would fill in by hand (tools/examples/own_loop.cpp).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "h5ddp/checkpointer.hpp"
#include "train/config.hpp"

namespace h5ddp {

// Local. --optimizer adam | adamw | sgd over `parameters` with --lr, --momentum, --weight-decay.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& config,
                                                        std::vector<torch::Tensor> parameters);

// Local. The run dir, save triggers, retention, async/fsync, load strategy, --on-save-error.
CheckpointerOptions checkpointer_options(const TrainConfig& config);

}  // namespace h5ddp

#include "train/loop_setup.hpp"

namespace h5ddp {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<torch::Tensor> p) {
  if (c.optimizer == OptimizerKind::kSgd)
    return std::make_unique<torch::optim::SGD>(
        p, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  if (c.optimizer == OptimizerKind::kAdamW)
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
}

CheckpointerOptions checkpointer_options(const TrainConfig& c) {
  CheckpointerOptions o;
  o.run_dir = c.run_dir;
  o.every_steps = c.checkpoint_every_steps;
  o.every_seconds = c.checkpoint_every_seconds;
  o.retention.keep_last = c.keep_last;
  o.retention.keep_every = c.keep_every;
  o.async = c.async_checkpoint;
  o.fsync = c.fsync;
  o.verify_replicas = c.verify_replicas;
  o.write_mode = c.checkpoint_write;
  for (const auto& h : c.mpiio_hints) o.mpiio_hints.push_back(parse_mpiio_hint(h));
  o.alignment = c.h5_alignment;
  o.load.mpiio_hints = o.mpiio_hints;
  o.load.strategy = c.load_strategy;
  o.continue_on_save_error = c.continue_on_save_error;
  return o;  // shard_optimizer: set by the Checkpointer from the ShardedOptimizer
}

}  // namespace h5ddp

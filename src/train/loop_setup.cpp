#include "train/loop_setup.hpp"

namespace h5ddp {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<torch::Tensor> p) {
  if (c.optimizer == "sgd")
    return std::make_unique<torch::optim::SGD>(
        p, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  if (c.optimizer == "adamw")
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
}

CheckpointerOptions checkpointer_options(const TrainConfig& c) {
  CheckpointerOptions o;
  o.run_dir = c.run_dir;
  o.every_steps = c.checkpoint_every_steps;
  o.every_seconds = c.checkpoint_every_seconds;
  o.keep_last = c.keep_last;
  o.keep_every = c.keep_every;
  o.async = c.async_checkpoint;
  o.fsync = c.fsync;
  o.verify_replicas = c.verify_replicas;
  o.write_mode = c.checkpoint_write == "direct"  ? WriteMode::kDirect
                 : c.checkpoint_write == "mpiio" ? WriteMode::kMpiio
                                                 : WriteMode::kAuto;
  for (const auto& h : c.mpiio_hints) o.mpiio_hints.push_back(parse_mpiio_hint(h));
  o.alignment = c.h5_alignment;
  o.load.mpiio_hints = o.mpiio_hints;
  o.load.strategy = c.load_strategy == "share-exchange" ? LoadStrategy::kShareExchange : LoadStrategy::kEveryRankReads;
  o.continue_on_save_error = c.on_save_error == "continue";
  return o;  // shard_optimizer: set by the Checkpointer from the ShardedOptimizer
}

DdpOptions ddp_options(const TrainConfig& c, const Compute& compute, Comm* device_comm) {
  DdpOptions o;
  o.device_comm = device_comm;
  o.reduce_bf16 = compute.bf16 && compute.device.is_cuda();  // NCCL sums bf16; MPI cannot
  o.shard = c.shard == "parameters"  ? ShardStage::kParameters
            : c.shard == "gradients" ? ShardStage::kGradients
            : c.shard == "optimizer" ? ShardStage::kOptimizer
                                     : ShardStage::kNone;
  return o;
}

}  // namespace h5ddp

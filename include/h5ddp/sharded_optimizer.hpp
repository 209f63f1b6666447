// The optimizer of a sharded wrapper (PyTorch's ZeroRedundancyOptimizer plays the same part): each rank's optimizer
// holds the state (Adam's moments, SGD's momentum) of the elements that rank owns only (row ranges of parameters,
// ShardedDataParallel::owned_pieces: a large matrix is split between ranks), and step() steps those and has the
// wrapper gather every rank's updated elements (ZeRO-1/2: now, into the whole model; FullyShardedDataParallel:
// when the next forward gathers each unit).
//
//   h5ddp::ShardedDataParallel dp(comm, *model, h5ddp::ShardStage::kGradients);  // or a FullyShardedDataParallel
//   h5ddp::ShardedOptimizer opt(dp, [](std::vector<torch::Tensor> p) {
//     return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3));
//   });
//   h5ddp::Checkpointer ckpt(comm, *model, opt, options);   // learns the sharding from it
//   ... ddp.prepare_forward(); loss.backward(); ddp.finish_backward(); opt.step(); opt.zero_grad(); ...
//
// A checkpoint of a sharded run is the file a replicated run writes (each rank writes the state it holds) and
// resumes on any number of ranks, sharded or not.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "h5ddp/sharded_ddp.hpp"
#include "h5ddp/torch_state.hpp"

namespace h5ddp {

class ShardedOptimizer {
 public:
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor> parameters)>;

  // Local. Builds this rank's optimizer with `make` over the pieces this rank owns (owned_parameters(), possibly
  // none). Throws ConfigError when `make` returns null. `dp` must outlive this object.
  ShardedOptimizer(ShardedDataParallel& dp, const Factory& make);

  // Collective (every rank of the DDP's comm): steps this rank's parameters with their averaged gradients, then
  // every rank receives the parameters the others stepped (ShardedDataParallel::gather_parameters). Every
  // parameter's .grad is zero afterwards.
  void step();
  // Local: zeroes the gradients of this rank's optimizer's parameters.
  void zero_grad() { local_->zero_grad(); }
  // Local: sets the learning rate of every parameter group (a schedule's value for this step).
  void set_lr(double lr);

  // This rank's optimizer (its state: the owned parameters' only; its param_groups: the owned parameters).
  torch::optim::Optimizer& local() { return *local_; }
  ShardedDataParallel& wrapper() { return dp_; }
  const ShardedDataParallel& wrapper() const { return dp_; }
  // The tensors local() holds, as pieces of the model's parameters (for the Checkpointer).
  std::vector<ParamPiece> pieces() const;

 private:
  ShardedDataParallel& dp_;
  std::unique_ptr<torch::optim::Optimizer> local_;
};

}  // namespace h5ddp

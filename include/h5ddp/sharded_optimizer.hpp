// ZeRO-1/2 as a wrapper of the optimizer (PyTorch's ZeroRedundancyOptimizer plays the same part): each rank's
// optimizer holds the state (Adam's moments, SGD's momentum) of the elements that rank owns only (row ranges of
// parameters, DistributedDataParallel::owned_pieces: a large matrix is split between ranks), and step() steps
// those and gathers every rank's updated elements, so the model is whole again on every rank.
//
//   h5ddp::DdpOptions o;
//   o.shard = h5ddp::ShardStage::kGradients;          // DDP reduce-scatters: each rank keeps its range only
//   h5ddp::DistributedDataParallel ddp(comm, *model, o);
//   h5ddp::ShardedOptimizer opt(ddp, [](std::vector<torch::Tensor> p) {
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

#include "h5ddp/ddp.hpp"
#include "h5ddp/torch_state.hpp"

namespace h5ddp {

class ShardedOptimizer {
 public:
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor> parameters)>;

  // Local. Builds this rank's optimizer with `make` over the pieces this rank owns
  // (DistributedDataParallel::owned_parameters(), possibly none). Throws ConfigError unless `ddp` was built with
  // DdpOptions::shard, or when `make` returns null. `ddp` must outlive this object.
  ShardedOptimizer(DistributedDataParallel& ddp, const Factory& make);

  // Collective (every rank of the DDP's comm): steps this rank's parameters with their averaged gradients, then
  // every rank receives the parameters the others stepped (DistributedDataParallel::gather_parameters). Every
  // parameter's .grad is zero afterwards.
  void step();
  // Local: zeroes the gradients of this rank's optimizer's parameters.
  void zero_grad() { local_->zero_grad(); }
  // Local: sets the learning rate of every parameter group (a schedule's value for this step).
  void set_lr(double lr);

  // This rank's optimizer (its state: the owned parameters' only; its param_groups: the owned parameters).
  torch::optim::Optimizer& local() { return *local_; }
  DistributedDataParallel& ddp() { return ddp_; }
  const DistributedDataParallel& ddp() const { return ddp_; }
  // The tensors local() holds, as pieces of the model's parameters (for the Checkpointer).
  std::vector<ParamPiece> pieces() const;

 private:
  DistributedDataParallel& ddp_;
  std::unique_ptr<torch::optim::Optimizer> local_;
};

}  // namespace h5ddp

// h5ddp-train's model under the wrapper --shard picks, with its optimizer: one "model + optimizer step" object
// whichever stage runs, so the trainer has no stage branch.
//   none        DistributedDataParallel + the optimizer over unique_parameters()
//   optimizer   ShardedDataParallel (ZeRO-1) + ShardedOptimizer
//   gradients   ShardedDataParallel (ZeRO-2) + ShardedOptimizer
//   parameters  FullyShardedDataParallel (ZeRO-3) + ShardedOptimizer; the model's forward runs its units through it
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "h5ddp/checkpointer.hpp"
#include "h5ddp/data_parallel.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "train/batch.hpp"
#include "train/config.hpp"
#include "train/models.hpp"

namespace h5ddp {

class ShardedOptimizer;

class ParallelModel {
 public:
  // Collective. Wraps `model` (after its move to the device) as --shard says; `device_comm`: the NCCL communicator
  // on CUDA (else null). Under --shard parameters the model's forward is made to run its units (TrainModel::units).
  ParallelModel(const TrainConfig& config, MpiComm& comm, TrainModel& model, const Compute& compute, Comm* device_comm);
  ~ParallelModel();

  DataParallel& wrapper() { return *dp_; }
  // Collective under --shard parameters (each unit's gather): the model's forward.
  torch::Tensor forward(const torch::Tensor& x);
  // Collective when sharded (the gather of the stepped parameters): one optimizer step at `lr`, then zero_grad.
  void step(double lr);
  // Collective when sharded: the step skipped (parameters and optimizer state unchanged), gradients cleared.
  void skip_step();
  // Collective. The Checkpointer over this model and optimizer.
  std::unique_ptr<Checkpointer> checkpointer(MpiComm& comm, CheckpointerOptions options);
  // Collective when sharded at more than one rank: rank 0 logs what each rank holds (--shard), or a note at 1 rank.
  void log_shards();
  // Local, before the model is built: the C library's heap tuned for what this stage allocates and frees.
  static void tune_heap(const TrainConfig& config);

 private:
  const TrainConfig& config_;
  TrainModel& model_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // replicated
  std::unique_ptr<ShardedOptimizer> sharded_;           // sharded (any stage)
};

}  // namespace h5ddp

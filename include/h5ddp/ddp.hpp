// DistributedDataParallel for LibTorch modules: the C++ counterpart of torch.nn.parallel.DDP. Every rank holds
// the whole model and optimizer; gradients are averaged over ranks in buckets (see bucketing.hpp), each bucket's
// allreduce starting as soon as autograd has produced all of its gradients, so communication overlaps the rest
// of backward. The reducer is DataParallel's (data_parallel.hpp); this class is its replicated strategy.
//
//   DistributedDataParallel ddp(comm, *model);     // the Checkpointer's order: (comm, model, ..., options)
//   torch::optim::Adam opt(h5ddp::unique_parameters(*model), 1e-3);
//   for (...) { ddp.prepare_forward(); auto loss = f(model->forward(x)); loss.backward();
//               ddp.finish_backward(); opt.step(); opt.zero_grad(); }
//
// ZeRO-1/2 (optimizer state and gradients split between ranks) is ShardedDataParallel (sharded_ddp.hpp); ZeRO-3
// (parameters too) is FullyShardedDataParallel (fsdp.hpp).
#pragma once

#include "h5ddp/data_parallel.hpp"

namespace h5ddp {

class DistributedDataParallel final : public DataParallel {
 public:
  // Collective: checks every rank built the same model (names, shapes, dtypes; DisagreementError naming the
  // first differing parameter and the ranks, on ALL ranks), broadcasts parameters and buffers from rank 0,
  // builds buckets, registers autograd hooks. `comm` and `module` must outlive this object (not owned, as in the
  // Checkpointer, whose constructor takes its arguments in the same order). After finish_backward every
  // parameter's .grad is the average over ranks (a view of its bucket).
  DistributedDataParallel(Comm& comm, torch::nn::Module& module, DdpOptions options = {});

  const char* shard_name() const override { return "none"; }

 protected:
  void setup_bucket(size_t b) override;
  bool counts_unused_in_last_bucket() const override { return true; }
  std::unique_ptr<Work> launch_reduction(size_t b) override;
  double reductions_done(size_t unused_here) override;
  void finish_gradients(const torch::Tensor& used_map) override;
};

}  // namespace h5ddp

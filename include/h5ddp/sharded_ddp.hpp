// ShardedDataParallel: ZeRO stages 1 and 2 (PyTorch's ZeroRedundancyOptimizer, fairscale's ShardedDataParallel).
// Every rank holds the whole model, but each rank owns one contiguous range of every bucket's flattened gradients
// (split_bucket, bucketing.hpp: cut between rows of a tensor, so one large matrix is split across ranks) and the
// optimizer state of those elements only. finish_backward reduce-scatters each bucket (instead of DDP's
// allreduce), so afterwards this rank's pieces (owned_pieces(): row ranges of parameters) hold the averaged
// gradient; ShardedOptimizer (sharded_optimizer.hpp) steps them and gather_parameters() gives every rank the
// elements the others stepped.
//
//   h5ddp::ShardedDataParallel dp(comm, *model, h5ddp::ShardStage::kGradients);
//   h5ddp::ShardedOptimizer opt(dp, [](std::vector<torch::Tensor> p) {
//     return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3)); });
//   ... dp.prepare_forward(); loss.backward(); dp.finish_backward(); opt.step(); opt.zero_grad(); ...
//
// The reducer (buckets, hooks, launch/wait) is DataParallel's; this class is its reduce-scatter strategy.
#pragma once

#include "h5ddp/data_parallel.hpp"

namespace h5ddp {

enum class ShardStage {
  kOptimizer = 1,  // ZeRO-1: optimizer state split; every bucket's full gradient buffer kept (the parameters' .grad,
                   //         zero outside this rank's range after finish_backward)
  kGradients = 2,  // ZeRO-2: + each bucket's buffer freed once its reduction is done, so only this rank's range of
                   //         the averaged gradients stays (the parameters' .grad is undefined after finish_backward)
};

class ShardedDataParallel : public DataParallel {
 public:
  // Collective, as DistributedDataParallel's constructor. reduce_bf16 does not apply (MPI has no bf16 sum).
  ShardedDataParallel(Comm& comm, torch::nn::Module& module, ShardStage stage, DdpOptions options = {});

  const char* shard_name() const override;

  // This rank's pieces, in bucket order (none when the model has fewer rows than ranks).
  const std::vector<OwnedPiece>& owned_pieces() const { return pieces_; }
  // The pieces' tensors (possibly none): what this rank's optimizer steps.
  std::vector<torch::Tensor> owned_parameters() const override;
  // Collective, after optimizer.step(): every rank receives the elements the other ranks updated (one allgatherv
  // per bucket). Afterwards every gradient this rank holds is zero, as after zero_grad().
  virtual void gather_parameters();

 protected:
  // For FullyShardedDataParallel: `kind` names the wrapper; `own_rows`: the pieces hold their rows in memory of
  // their own and the parameters' storage is freed (ZeRO-3). The subclass calls check_same_model and build.
  ShardedDataParallel(Comm& comm, torch::nn::Module& module, DdpOptions options, std::string kind, bool own_rows);

  void setup_bucket(size_t b) override;
  void setup_done() override;
  void ensure_bucket(size_t b) override;
  bool store_gradient(size_t index) override;
  std::unique_ptr<Work> launch_reduction(size_t b) override;
  void after_launch() override;
  double reductions_done(size_t unused_here) override;
  void finish_gradients(const torch::Tensor& used_map) override;
  bool gradients_are_split() const override { return true; }

  // The bucket's reduction waited for, this rank's range averaged into shard_grad, the buffer freed (stage 2+).
  void release_bucket(size_t b);
  // A one-parameter bucket reduces autograd's own gradient tensor in place (no second copy in flight).
  bool adopt_gradient(size_t index);
  // Frees a parameter's storage (its shape and autograd identity stay) / allocates it again (ZeRO-3).
  static void free_storage(const torch::Tensor& t);
  static void allocate_storage(const torch::Tensor& t, size_t nbytes);

  bool keep_owned_only_;             // stage 2 and 3: buffers live for one step, the owned range stays
  bool own_rows_;                    // stage 3: pieces own their rows; parameter storage freed between uses
  std::vector<OwnedPiece> pieces_;   // this rank's row ranges
  std::vector<size_t> param_piece_;  // param -> its piece in pieces_ (SIZE_MAX: none here)
};

}  // namespace h5ddp

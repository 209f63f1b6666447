// The gradient reducer that the three data-parallel wrappers share: DistributedDataParallel (ddp.hpp:
// replicated, allreduce), ShardedDataParallel (sharded_ddp.hpp: ZeRO-1/2, reduce-scatter into the rows a rank
// owns) and FullyShardedDataParallel (fsdp.hpp: ZeRO-3, parameters kept as row shards and gathered per unit).
//
// DataParallel owns what they have in common: the model check and the initial broadcast from rank 0, the
// buckets, the autograd hooks that launch a bucket's reduction as soon as its gradients are ready (so
// communication overlaps the rest of backward), the wait, the unused-parameter flush, no_sync and the buffer
// broadcasts. How a bucket is laid out, reduced and turned back into gradients is the strategy: the protected
// virtual functions below, which each wrapper implements in its own file. This file names no sharding stage.
//
// Backend by tensor device: CPU parameters are reduced through the constructor's `comm` (MpiComm); CUDA
// parameters through `DdpOptions::device_comm` (an NcclComm over device buffers). Control traffic (model
// check, unused-parameter agreement) always uses `comm`. Talks to Comm only, never to MPI or NCCL.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "h5ddp/bucketing.hpp"
#include "h5ddp/comm.hpp"

namespace h5ddp {

// The h5ddp dtype (Comm, checkpoints) of a torch scalar type; nullopt for types h5ddp does not carry
// (complex, quantized, ...). One mapping for the ddp and train layers.
std::optional<DType> dtype_of(torch::ScalarType t);

// module.parameters() with each tensor once, in order. LibTorch lists a tied weight (one tensor under two state-dict
// names, e.g. a language model's head sharing its token embedding: `head.weight = tok.weight`) once per name,
// where Python's parameters() lists it once; an optimizer built over the duplicates would step it twice. Build
// optimizers over this (the wrappers and the Checkpointer treat the first name as the parameter's, the others as
// aliases).
std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module);

// Options every wrapper takes.
struct DdpOptions {
  size_t first_bucket_bytes = kFirstBucketBytes;
  size_t bucket_cap_bytes = kBucketBytesCap;
  // Broadcast buffers (e.g. BatchNorm running statistics) from rank 0 in every synchronised prepare_forward.
  bool broadcast_buffers = true;
  // false: a parameter that got no gradient in a synchronised step is an error naming it (raised on all
  //        ranks, after the step's collectives completed, so nothing hangs).
  // true:  such a parameter contributes its current .grad (zeros if undefined) on that rank, like PyTorch's
  //        find_unused_parameters; one extra small allreduce per step finds parameters unused on every
  //        rank, whose undefined .grad is then left undefined.
  bool find_unused_parameters = false;
  // Communicator for CUDA parameters (an NcclComm); required iff the module has CUDA parameters. Not owned.
  Comm* device_comm = nullptr;
  // DistributedDataParallel only: float32 CUDA buckets travel as bfloat16 over device_comm (half the bytes; each
  // rank's gradient rounded to bf16 before the sum, as PyTorch's bf16 compression hook does) and are widened back
  // before averaging. CPU buckets keep their dtype: MPI has no bfloat16 sum.
  bool reduce_bf16 = false;
};

// A row range of a synchronised parameter that this rank owns under sharding. `tensor` aliases those rows of
// the parameter's storage (not an autograd view: the optimizer steps it in place, and so the parameter) and its
// .grad aliases this rank's averaged gradient of them; the optimizer holds these tensors.
struct OwnedPiece {
  size_t index = 0;  // into DataParallel::parameters()
  int64_t row_begin = 0, row_end = 0;
  torch::Tensor tensor;
};

class DataParallel {
 public:
  virtual ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  torch::nn::Module& module() { return *module_; }
  const DdpOptions& options() const { return options_; }
  Comm& comm() { return comm_; }

  // What the wrapper keeps split between ranks, as /meta shard names it: "none", "optimizer" (ZeRO-1),
  // "gradients" (ZeRO-2), "parameters" (ZeRO-3).
  virtual const char* shard_name() const = 0;

  // Collective when broadcast_buffers (outside no_sync): broadcasts buffers from rank 0. Arms the reducer
  // for the coming backward. Call before every forward whose backward should synchronise.
  void prepare_forward();
  // Collective (outside no_sync): launches the buckets not yet launched, waits for every bucket, and leaves each
  // gradient this rank holds (the parameters' .grad, or the owned pieces') the average over ranks. Inside
  // no_sync: does nothing.
  void finish_backward();

  // Collective: broadcasts buffers (and frozen parameters) from rank 0 now. After a forward in training mode
  // every rank has updated its own buffers (BatchNorm running statistics), which the next prepare_forward
  // replaces with rank 0's; call this before saving or evaluating, so every rank holds what rank 0 holds
  // (a checkpoint's replica check refuses buffers that differ between ranks). Does not change training.
  void sync_buffers();

  // RAII scope in which gradients accumulate locally with no communication (gradient accumulation). The
  // first synchronised step after it reduces the accumulated .grad, as PyTorch's no_sync does.
  class NoSync {
   public:
    explicit NoSync(DataParallel& dp);
    ~NoSync();
    NoSync(NoSync&& other) noexcept;
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DataParallel* dp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  bool in_no_sync() const { return no_sync_; }

  // The synchronised parameters (requires_grad, each tensor once), in registration order; buckets() index them.
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  const std::vector<std::string>& parameter_names() const { return param_names_; }
  const std::vector<BucketSpec>& buckets() const { return buckets_; }

  // What this rank's optimizer steps: the parameters (replicated) or this rank's pieces of them (sharded).
  virtual std::vector<torch::Tensor> owned_parameters() const { return params_; }
  // Collective. Copies of the synchronised parameters, whole, in parameters() order: the model's weights for an
  // export or a comparison, whatever the wrapper keeps.
  virtual std::vector<torch::Tensor> full_parameters();

  // Collective, after finish_backward (outside no_sync). Clips the global L2 norm of the averaged gradients to
  // `max_norm` (> 0), as torch.nn.utils.clip_grad_norm_ does: total = the norm of the per-tensor norms,
  // coefficient = min(1, max_norm / (total + 1e-6)) in the gradients' dtype, every gradient multiplied by it.
  // Replicated, the arithmetic is PyTorch's, so the gradients equal clip_grad_norm_'s bit for bit; sharded, each
  // rank holds only its pieces' gradients, so the norm is the square root of the ranks' summed squared norms
  // (equal to PyTorch's within float rounding). One allreduce makes the total one agreed value on every rank.
  // Returns it; when it is not finite on any rank (inf or NaN: an overflow somewhere) nothing is scaled and every
  // rank returns NaN, so a caller can skip the step on every rank alike.
  double clip_grad_norm(double max_norm);

  struct Stats {
    size_t steps = 0;                         // synchronised finish_backward calls
    size_t buckets_launched = 0;              // all launches
    size_t buckets_launched_in_backward = 0;  // launched from autograd hooks (could overlap backward)
    size_t bytes_reduced = 0;
    double comm_wait_seconds = 0;  // time finish_backward spent waiting for reductions
    double finish_seconds = 0;     // total time in finish_backward (wait + launch + average + copy)
    double broadcast_seconds = 0;  // buffer broadcasts in prepare_forward
    double gather_seconds = 0;     // sharded: parameter gathers (after the step; FSDP: per unit)
    size_t unit_gathers = 0;       // FSDP: units gathered (forward and backward; prefetched ones included)
    size_t prefetched = 0;         // FSDP: of those, gathers started ahead of their unit (FsdpOptions::prefetch)
  };
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = Stats{}; }

  // Internal (called from the autograd hook): parameter `index` has its gradient accumulated.
  void on_grad_ready(size_t index);

 protected:
  // A bucket's state. `buffer` is flat; a bucket that counts_unused_in_last_bucket() has one extra trailing
  // element in the last bucket (see flush_unused).
  struct Bucket {
    torch::Tensor buffer;      // may be allocated per step (ensure_bucket) and freed once reduced
    torch::Tensor shard_grad;  // sharded strategies: this rank's range of the averaged gradients
    bool released = false;     // sharded strategies: this step's reduction kept in shard_grad, the buffer freed
    torch::Tensor wire;        // the copy on the wire when it differs from buffer (bf16), else undefined
    int64_t grad_numel = 0;
    std::vector<size_t> counts;  // sharded strategies: elements of each rank's range (split_bucket)
    int64_t own_offset = 0;      // sharded strategies: this rank's range
    int64_t own_count = 0;
    size_t pending = 0;  // parameters whose gradient is not ready yet in this step
    std::unique_ptr<Work> work;
    Comm* comm = nullptr;
  };
  // Where each parameter's gradient goes.
  struct ParamSlot {
    size_t bucket = 0;
    int64_t offset = 0;  // first element in its bucket
    torch::Tensor slot;  // view into its bucket's buffer, shaped like the parameter (undefined while freed)
    bool ready = false;  // hook fired in this step
  };

  // Local. Collects the parameters (each tensor once; param_aliases_ holds the other names of a tied one) and
  // buffers. `kind` names the wrapper in errors. The subclass's constructor then calls check_same_model and build.
  DataParallel(Comm& comm, torch::nn::Module& module, DdpOptions options, std::string kind);
  // Collective. Every rank built the same model and options (`options_line`: the subclass's), else
  // DisagreementError on every rank naming the first difference; `problem` (a local reason to refuse, e.g. CUDA
  // tensors without a device_comm) is raised on every rank first.
  void check_same_model(const std::string& problem, const std::string& options_line);
  // Collective: broadcasts parameters and buffers from rank 0, builds the buckets (layout(), setup_bucket()) and
  // registers the autograd hooks.
  void build();

  // --- Strategy ---
  // The buckets, in launch order, over parameters of these byte sizes and (dtype, device) groups.
  virtual std::vector<BucketSpec> layout(const std::vector<size_t>& nbytes, const std::vector<int>& group) const;
  // After a bucket's fields above are set (grad_numel, comm): the strategy's own (ranges, buffers).
  virtual void setup_bucket(size_t b) = 0;
  // After all buckets are set up.
  virtual void setup_done() {}
  // true: the last bucket carries the number of unused parameters in one trailing element (no extra collective).
  virtual bool counts_unused_in_last_bucket() const { return false; }
  // The bucket's buffer (and its slots) exist for this step.
  virtual void ensure_bucket(size_t /*b*/) {}
  // Parameter `index`'s gradient is ready in .grad: stored into its bucket by the strategy (true), or to be
  // copied into its slot by the reducer (false).
  virtual bool store_gradient(size_t /*index*/) { return false; }
  // Starts bucket b's reduction; its Work (or null when nothing was launched).
  virtual std::unique_ptr<Work> launch_reduction(size_t b) = 0;
  // After launches in a step (the first next_launch_ buckets are launched).
  virtual void after_launch() {}
  // Parameter `index` is done for this backward (its gradient accumulated; in no_sync too).
  virtual void gradient_done(size_t /*index*/) {}
  // Every launched reduction is waited for; `unused_here` parameters were unused on this rank. Returns the number
  // of unused parameters over all ranks (collective when the strategy does not count them in the last bucket).
  virtual double reductions_done(size_t unused_here) = 0;
  // The sums become averages and land where the optimizer reads them. `used_map` (find_unused_parameters only):
  // 1 per parameter some rank used.
  virtual void finish_gradients(const torch::Tensor& used_map) = 0;
  // The gradients clip_grad_norm scales, and whether they are split between ranks (the norm then sums squares).
  virtual bool gradients_are_split() const { return false; }

  // Helpers for strategies.
  void copy_into_slot(size_t index);  // .grad (zeros if undefined) into the parameter's bucket slot
  static DType to_dtype(torch::ScalarType t);
  static int64_t row_numel(const torch::Tensor& p);
  // A tensor of `shape` over `base`'s storage from element `offset` on: an alias, not an autograd view
  // (optimizers' zero_grad() calls detach_() on .grad, which LibTorch refuses for views).
  static torch::Tensor alias(const torch::Tensor& base, int64_t offset, c10::IntArrayRef shape);

  torch::nn::Module* module_;
  Comm& comm_;
  DdpOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> param_names_;
  std::vector<std::vector<std::string>> param_aliases_;  // the other state-dict names of a tied parameter
  std::vector<torch::Tensor> buffers_;
  std::vector<BucketSpec> buckets_;
  std::vector<std::unique_ptr<Bucket>> bucket_state_;
  std::vector<ParamSlot> param_;
  size_t next_launch_ = 0;
  std::mutex mutex_;
  bool armed_ = false;
  bool no_sync_ = false;
  Stats stats_;

 private:
  struct Hook;
  std::vector<std::string> model_signature(const std::string& options_line) const;
  [[noreturn]] void raise_model_difference(const std::vector<std::string>& entries, const std::string& joined);
  std::vector<size_t> flush_unused();
  void launch_ready_buckets(bool from_hook);
  void drive_progress();
  void raise_unused(const std::vector<size_t>& unused_local);
  std::string kind_;
  std::vector<std::unique_ptr<Hook>> hooks_;
};

}  // namespace h5ddp

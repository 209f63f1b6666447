// DistributedDataParallel for LibTorch modules: the C++ counterpart of torch.nn.parallel.DDP.
// Gradients are averaged over ranks in buckets (see bucketing.hpp); each bucket's allreduce starts as soon
// as autograd has produced all of its gradients, so communication overlaps the rest of backward.
//
//   DistributedDataParallel ddp(comm, *model);     // the Checkpointer's order: (comm, model, ..., options)
//   for (...) { ddp.prepare_forward(); auto loss = f(model->forward(x)); loss.backward();
//               ddp.finish_backward(); optimizer.step(); optimizer.zero_grad(); }
//
// Backend by tensor device: CPU parameters are reduced through the constructor's `comm` (MpiComm); CUDA
// parameters through `DdpOptions::device_comm` (an NcclComm over device buffers). Control traffic (model
// check, unused-parameter agreement) always uses `comm`. Talks to Comm only, never to MPI or NCCL.
#pragma once

#include <torch/torch.h>

#include <functional>
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
// optimizers over this (DDP and the Checkpointer treat the first name as the parameter's, the others as aliases).
std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module);

// How much of the training state is split between ranks (ZeRO stages; docs/SHARDING.md). Each rank owns one
// contiguous range of every bucket's flattened gradients (split_bucket: between rows of a tensor, so one tensor
// may be split across ranks) and the optimizer state of those elements.
enum class ShardStage {
  kNone = 0,        // replicated: every rank holds everything (DDP)
  kOptimizer = 1,   // ZeRO-1: optimizer state split; gradients reduce-scattered, full gradient buffers kept
  kGradients = 2,   // ZeRO-2: + only this rank's range of the averaged gradients is kept
  kParameters = 3,  // ZeRO-3: + parameters kept as shards, gathered per unit (run_unit)
};
const char* shard_stage_name(ShardStage s);  // "none", "optimizer", "gradients", "parameters"

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
  // float32 CUDA buckets travel as bfloat16 over device_comm (half the bytes; each rank's gradient rounded to
  // bf16 before the sum, as PyTorch's bf16 compression hook does) and are widened back before averaging. CPU
  // buckets keep their dtype: MPI has no bfloat16 sum.
  bool reduce_bf16 = false;
  // Sharding (ShardStage). finish_backward reduce-scatters each bucket instead of allreducing it: afterwards
  // this rank's pieces (owned_pieces(): row ranges of parameters) hold the averaged gradient. Build the optimizer
  // over owned_parameters() (ShardedOptimizer does) and call gather_parameters() after every optimizer.step().
  // Stage 1 keeps every bucket's full gradient buffer (the parameters' .grad, zero outside this rank's range);
  // stage 2 frees each bucket once its reduction is done, so only this rank's range of the gradients stays
  // (the parameters' .grad is undefined after finish_backward). reduce_bf16 does not apply to sharded buckets.
  // Stage 3 keeps each parameter as this rank's rows only (the pieces own their memory); the parameters' own
  // storage is empty except while run_unit() runs a unit's forward, or autograd runs its backward.
  ShardStage shard = ShardStage::kNone;
  // Stage 3: the units a forward runs one at a time (run_unit), as module names: a parameter belongs to the unit
  // whose name prefixes its own ("fc1" holds "fc1.weight"). Empty: the module's top-level children that hold
  // parameters. Every synchronised parameter must belong to exactly one unit.
  std::vector<std::string> units;
  bool shard_optimizer = false;  // the same as shard = kOptimizer (when shard is kNone)
  ShardStage stage() const {
    return shard != ShardStage::kNone ? shard : shard_optimizer ? ShardStage::kOptimizer : shard;
  }
  bool sharded() const { return stage() != ShardStage::kNone; }
};

// A row range of a synchronised parameter that this rank owns under sharding. `tensor` aliases those rows of
// the parameter's storage (not an autograd view: the optimizer steps it in place, and so the parameter) and its
// .grad aliases this rank's averaged gradient of them; the optimizer holds these tensors.
struct OwnedPiece {
  size_t index = 0;  // into DistributedDataParallel::parameters()
  int64_t row_begin = 0, row_end = 0;
  torch::Tensor tensor;
};

class DistributedDataParallel {
 public:
  // Collective: checks every rank built the same model (names, shapes, dtypes; DisagreementError naming the
  // first differing parameter and the ranks, on ALL ranks), broadcasts parameters and buffers from rank 0,
  // builds buckets, registers autograd hooks. `comm` and `module` must outlive this object (not owned, as in the
  // Checkpointer, whose constructor takes its arguments in the same order).
  DistributedDataParallel(Comm& comm, torch::nn::Module& module, DdpOptions options = {});
  // Removes the autograd hooks. Not collective. Does not throw.
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() { return *module_; }
  const DdpOptions& options() const { return options_; }

  // Collective when broadcast_buffers (outside no_sync): broadcasts buffers from rank 0. Arms the reducer
  // for the coming backward. Call before every forward whose backward should synchronise.
  void prepare_forward();
  // Collective (outside no_sync): launches the buckets not yet launched, waits for every bucket, and sets
  // .grad of every parameter to the average over ranks. Inside no_sync: does nothing.
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
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(NoSync&& other) noexcept;
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  bool in_no_sync() const { return no_sync_; }

  // The synchronised parameters (requires_grad), in registration order; buckets() index into them.
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  const std::vector<std::string>& parameter_names() const { return param_names_; }
  const std::vector<BucketSpec>& buckets() const { return buckets_; }

  // Sharded: this rank's pieces, in bucket order (none when the model has fewer rows than ranks); else empty.
  const std::vector<OwnedPiece>& owned_pieces() const { return pieces_; }
  // What this rank's optimizer steps: sharded, the pieces' tensors (possibly none); else the parameters.
  std::vector<torch::Tensor> owned_parameters() const;
  // Collective, sharded only, after optimizer.step(): every rank receives the elements the other ranks updated
  // (one allgatherv per bucket; stage 3: none, the next run_unit gathers). Afterwards every gradient this rank
  // holds is zero, as after zero_grad().
  void gather_parameters();

  // Stage 3 (ZeRO-3). The model's forward runs each unit through run_unit: collective, it gathers the unit's
  // parameters (allgatherv of every rank's rows into the parameters' storage), runs `forward`, and frees the
  // storage again; when the result needs a gradient, a hook on it gathers the parameters again just before
  // autograd runs the unit's backward, and they are freed once their gradients are accumulated (each gradient
  // is reduce-scattered as it becomes ready, as in stage 2). Every rank must run the same units in the same
  // order. The result must depend on the unit's parameters through autograd only. Other stages: returns
  // forward(). ConfigError for a name that is not a unit.
  torch::Tensor run_unit(const std::string& unit, const std::function<torch::Tensor()>& forward);
  const std::vector<std::string>& unit_names() const { return unit_names_; }
  // Collective (stage 3: gathers each unit in turn). Copies of the synchronised parameters, whole, in parameters()
  // order: the model's weights for an export or a comparison, whatever the stage.
  std::vector<torch::Tensor> full_parameters();

  // Collective, after finish_backward (outside no_sync). Clips the global L2 norm of the averaged gradients to
  // `max_norm` (> 0), as torch.nn.utils.clip_grad_norm_ does: total = the norm of the per-tensor norms,
  // coefficient = min(1, max_norm / (total + 1e-6)) in the gradients' dtype, every gradient multiplied by it.
  // Replicated, the arithmetic is PyTorch's, so the gradients equal clip_grad_norm_'s bit for bit; with
  // shard_optimizer each rank holds only its parameters' gradients, so the norm is the square root of the
  // ranks' summed squared norms (equal to PyTorch's within float rounding). One allreduce makes the total one
  // agreed value on every rank. Returns it; when it is not finite on any rank (inf or NaN: an overflow somewhere)
  // nothing is scaled and every rank returns NaN, so a caller can skip the step on every rank alike.
  double clip_grad_norm(double max_norm);

  struct Stats {
    size_t steps = 0;                         // synchronised finish_backward calls
    size_t buckets_launched = 0;              // all launches
    size_t buckets_launched_in_backward = 0;  // launched from autograd hooks (could overlap backward)
    size_t bytes_reduced = 0;
    double comm_wait_seconds = 0;  // time finish_backward spent waiting for allreduces
    double finish_seconds = 0;     // total time in finish_backward (wait + launch + average + copy)
    double broadcast_seconds = 0;  // buffer broadcasts in prepare_forward
    double gather_seconds = 0;     // gather_parameters (stages 1-2), run_unit's gathers (stage 3)
    size_t unit_gathers = 0;       // stage 3: units gathered (forward and backward)
  };
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = Stats{}; }

  // Internal (called from the autograd hook): parameter `index` has its gradient accumulated.
  void on_grad_ready(size_t index);

 private:
  struct Bucket;
  // Collective. Every rank built the same model and options, else DisagreementError on every rank naming the
  // first difference (local problems, e.g. CUDA tensors without a device_comm, first).
  void check_same_model();
  std::string local_model_problem() const;
  std::vector<std::string> model_signature() const;  // options, then "kind name dtype[shape]" per tensor
  [[noreturn]] void raise_model_difference(const std::vector<std::string>& entries, const std::string& joined);
  // The phases of finish_backward: unused parameters' gradients into their buckets and the rest launched
  // (returns the unused ones); every reduction waited for (returns the unused count over ranks when sharded);
  // the sums averaged; every .grad pointed at its bucket slot.
  std::vector<size_t> flush_unused();
  double wait_for_reductions(size_t unused_here, Work* used_work);
  void average_gradients();
  void point_grads_at_buckets(const torch::Tensor& used_map);
  void build_buckets();
  void launch_ready_buckets(bool from_hook);
  void launch(size_t b, bool from_hook);
  void drive_progress();
  Comm& comm_for(const torch::Device& device) const;
  void raise_unused(const std::vector<size_t>& unused_local);

  torch::nn::Module* module_;
  Comm& comm_;
  DdpOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> param_names_;
  std::vector<torch::Tensor> buffers_;
  std::vector<BucketSpec> buckets_;
  std::vector<std::unique_ptr<Bucket>> bucket_state_;
  std::vector<int64_t> param_offset_;  // param -> first element in its bucket
  std::vector<OwnedPiece> pieces_;     // sharded: this rank's row ranges
  void build_pieces();
  bool keeps_grad_shards() const { return options_.stage() >= ShardStage::kGradients; }  // stages 2 and 3
  // Stage 3.
  std::string resolve_units();        // param_unit_ from options_.units; returns the problem, if any
  void gather_unit(size_t u);         // collective
  void regather_unit(size_t u);       // collective: before the unit's backward (the hook on its output)
  void release_unit(size_t u);        // local: the unit's parameters' storage freed
  void note_unit_grad(size_t index);  // a gradient of the unit accumulated; the last frees the unit
  std::vector<std::string> unit_names_;
  std::vector<std::vector<size_t>> unit_params_;
  std::vector<size_t> param_unit_;
  std::vector<size_t> param_nbytes_;  // stage 3: each parameter's storage size
  std::vector<size_t> param_piece_;   // stage 3: param -> its piece in pieces_ (SIZE_MAX: none here)
  std::string unit_problem_;
  std::vector<uint8_t> unit_gathered_;
  std::vector<size_t> unit_left_;     // stage 3: gradients still to accumulate in this backward, per unit
  void ensure_buffer(size_t b);       // stage 2: the bucket's buffer (and its slots) for this step
  void release_bucket(size_t b);      // stage 2: this rank's averaged range kept, the buffer freed
  bool adopt_gradient(size_t index);  // stage 2: a one-parameter bucket reduces autograd's gradient in place
  void finish_grad_ready(size_t index, size_t b);
  std::vector<size_t> param_bucket_;       // param -> bucket index
  std::vector<torch::Tensor> param_slot_;  // param -> view into its bucket buffer, shaped like the param
  std::vector<uint8_t> ready_;             // param -> hook fired in this step
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  size_t next_launch_ = 0;
  std::mutex mutex_;
  bool armed_ = false;
  bool no_sync_ = false;
  Stats stats_;
};

}  // namespace h5ddp

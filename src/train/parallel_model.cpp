#include "train/parallel_model.hpp"

#include <algorithm>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "h5ddp/ddp.hpp"
#include "h5ddp/fsdp.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/sharded_optimizer.hpp"
#include "train/loop_setup.hpp"

namespace h5ddp {

ParallelModel::ParallelModel(const TrainConfig& config, MpiComm& comm, TrainModel& model, const Compute& compute,
                             Comm* device_comm)
    : config_(config), model_(model) {
  DdpOptions o;
  o.device_comm = device_comm;
  o.reduce_bf16 = compute.bf16 && compute.device.is_cuda();  // NCCL sums bf16; MPI cannot
  if (config.shard == ShardOption::kParameters) {
    FsdpOptions f = model.units(config.shard_unit_params);
    f.ddp = o;
    f.prefetch = config.shard_prefetch;
    auto fsdp = std::make_unique<FullyShardedDataParallel>(comm, *model.module, f);
    model.attach_units(*fsdp);
    dp_ = std::move(fsdp);
  } else if (config.shard != ShardOption::kNone) {
    dp_ = std::make_unique<ShardedDataParallel>(
        comm, *model.module, config.shard == ShardOption::kGradients ? ShardStage::kGradients : ShardStage::kOptimizer,
        o);
  } else {
    dp_ = std::make_unique<DistributedDataParallel>(comm, *model.module, o);
  }
  // After the move to the device (state there); sharded: over this rank's pieces only.
  const auto make = [&](std::vector<torch::Tensor> p) { return make_optimizer(config, std::move(p)); };
  if (auto* sharded = dynamic_cast<ShardedDataParallel*>(dp_.get()))
    sharded_ = std::make_unique<ShardedOptimizer>(*sharded, make);
  else
    optimizer_ = make(unique_parameters(*model.module));
}

ParallelModel::~ParallelModel() = default;

torch::Tensor ParallelModel::forward(const torch::Tensor& x) {
  if (auto* fsdp = dynamic_cast<FullyShardedDataParallel*>(dp_.get()))
    return fsdp->run_forward([&] { return model_.forward(x); });
  return model_.forward(x);
}

void ParallelModel::step(double lr) {
  if (sharded_) {
    sharded_->set_lr(lr);
    sharded_->step();  // the wrapper gathers the other ranks' parameters
    sharded_->zero_grad();
    return;
  }
  for (auto& g : optimizer_->param_groups()) g.options().set_lr(lr);
  optimizer_->step();
  optimizer_->zero_grad();
}

void ParallelModel::skip_step() {
  if (sharded_) {
    sharded_->zero_grad();
    sharded_->wrapper().gather_parameters();  // unchanged parameters; empties the gradient buckets as a step would
  } else {
    optimizer_->zero_grad();
  }
}

std::unique_ptr<Checkpointer> ParallelModel::checkpointer(MpiComm& comm, CheckpointerOptions options) {
  if (sharded_) return std::make_unique<Checkpointer>(comm, *model_.module, *sharded_, std::move(options));
  return std::make_unique<Checkpointer>(comm, *model_.module, *optimizer_, std::move(options));
}

void ParallelModel::tune_heap(const TrainConfig& config) {
  if (config.shard == ShardOption::kNone) {
    keep_freed_memory_in_heap();  // evaluations free their activations every batch
    return;
  }
#if defined(__GLIBC__)
  // Sharded stages exist to save memory, and they allocate and free a layer's gradient (ZeRO-2, 3) and weights
  // (ZeRO-3) every step. Above 1 MiB glibc then maps and unmaps, so freed memory goes back to the system
  // instead of staying resident in the heap (its dynamic threshold would rise to 32 MiB): peak RSS per rank
  // 1132 -> 913 MiB (ZeRO-3) and 1388 -> 1255 MiB (ZeRO-2) in docs/BENCHMARKS.md's 130 M-parameter run.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
}

void ParallelModel::log_shards() {
  if (!sharded_) return;
  Comm& comm = dp_->comm();
  if (comm.size() == 1) {
    if (comm.rank() == 0)
      log::root_info(std::string("note: --shard ") + option_word(config_.shard) +
                     " at 1 rank splits nothing (the one rank holds every range) and saves no memory; its "
                     "checkpoints resume under any --shard at any rank count");
    return;
  }
  int64_t owned = 0;
  for (const auto& piece : sharded_->wrapper().owned_pieces()) owned += piece.tensor.numel();
  std::vector<int64_t> all(comm.size());
  comm.allgather(&owned, all.data(), 1, DType::kI64);
  std::string list;
  int64_t total = 0;
  for (int64_t n : all) list += (list.empty() ? "" : ", ") + std::to_string(n), total += n;
  const auto [lo, hi] = std::minmax_element(all.begin(), all.end());
  std::string line = std::string("shard: ") + option_word(config_.shard) +
                     "; parameter elements whose optimizer state each rank holds: " + list + " (largest " +
                     std::to_string(static_cast<double>(*hi) * comm.size() / std::max<int64_t>(1, total)) +
                     " x the even share, smallest " + std::to_string(*lo) + ")";
  if (auto* fsdp = dynamic_cast<FullyShardedDataParallel*>(dp_.get())) {
    const auto& units = fsdp->unit_names();
    const auto root = fsdp->root_parameter_names();
    line += "; " + std::to_string(units.size()) + " units (";
    for (size_t i = 0; i < units.size() && i < 4; ++i) line += (i ? ", " : "") + units[i];
    line += units.size() > 4 ? ", ...)" : ")";
    line += ", root " + std::to_string(root.size()) + " parameters gathered for the whole step";
  }
  if (comm.rank() == 0) log::root_info(line);
}

}  // namespace h5ddp

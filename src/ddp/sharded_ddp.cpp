#include "h5ddp/sharded_ddp.hpp"

#include <c10/core/StorageImpl.h>

#include "h5ddp/clock.hpp"
#include "h5ddp/error.hpp"

namespace h5ddp {

ShardedDataParallel::ShardedDataParallel(Comm& comm, torch::nn::Module& module, ShardStage stage, DdpOptions options)
    : ShardedDataParallel(comm, module, options, "ShardedDataParallel", false) {
  keep_owned_only_ = stage == ShardStage::kGradients;
  check_same_model("", std::string("shard=") + shard_name());
  build();
}

ShardedDataParallel::ShardedDataParallel(Comm& comm, torch::nn::Module& module, DdpOptions options, std::string kind,
                                         bool own_rows)
    : DataParallel(comm, module, options, std::move(kind)), keep_owned_only_(own_rows), own_rows_(own_rows) {}

const char* ShardedDataParallel::shard_name() const {
  return own_rows_ ? "parameters" : keep_owned_only_ ? "gradients" : "optimizer";
}

void ShardedDataParallel::free_storage(const torch::Tensor& t) {
  // Autograd's saved tensors of the parameter share the storage, so a backward sees whatever it holds when it runs.
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void ShardedDataParallel::allocate_storage(const torch::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  c10::Allocator* a = s->allocator() != nullptr ? s->allocator() : c10::GetAllocator(t.device().type());
  s->set_data_ptr_noswap(a->allocate(nbytes));
  s->set_nbytes(nbytes);
}

void ShardedDataParallel::setup_bucket(size_t b) {
  Bucket& st = *bucket_state_[b];
  std::vector<int64_t> numel, rows;
  for (size_t i : buckets_[b].params) {
    numel.push_back(params_[i].numel());
    rows.push_back(row_numel(params_[i]));
  }
  const std::vector<int64_t> cuts = split_bucket(numel, rows, comm_.size());
  for (int r = 0; r < comm_.size(); ++r) st.counts.push_back(static_cast<size_t>(cuts[r + 1] - cuts[r]));
  st.own_offset = cuts[comm_.rank()];
  st.own_count = cuts[comm_.rank() + 1] - cuts[comm_.rank()];
  // Stage 3 allocates it as the parameters are freed (setup_done), so the model is never held twice over.
  if (keep_owned_only_ && !own_rows_)
    st.shard_grad = torch::zeros({st.own_count}, params_[buckets_[b].params.front()].options().requires_grad(false));
  if (!keep_owned_only_) ensure_bucket(b);
}

void ShardedDataParallel::ensure_bucket(size_t b) {
  Bucket& st = *bucket_state_[b];
  if (st.buffer.defined()) return;
  st.buffer = torch::zeros({st.grad_numel}, params_[buckets_[b].params.front()].options().requires_grad(false));
  for (size_t i : buckets_[b].params) param_[i].slot = alias(st.buffer, param_[i].offset, params_[i].sizes());
}

bool ShardedDataParallel::adopt_gradient(size_t index) {
  // A bucket of one parameter: its fresh gradient (autograd's, which nothing else reads) becomes the bucket's
  // buffer, reduced in place: no second copy of the largest tensors while they are in flight.
  const size_t b = param_[index].bucket;
  Bucket& st = *bucket_state_[b];
  const torch::Tensor& grad = params_[index].grad();
  if (buckets_[b].params.size() != 1 || st.buffer.defined() || !grad.defined() || grad.is_sparse() ||
      !grad.is_contiguous() || grad.scalar_type() != params_[index].scalar_type() ||
      grad.device() != params_[index].device() || grad.numel() != st.grad_numel)
    return false;
  st.buffer = grad.detach().view({-1});
  param_[index].slot = grad.detach();
  params_[index].mutable_grad() = torch::Tensor();
  return true;
}

bool ShardedDataParallel::store_gradient(size_t index) {
  if (!keep_owned_only_) return false;  // the reducer copies it into the permanent buffer
  if (adopt_gradient(index)) return true;
  ensure_bucket(param_[index].bucket);
  copy_into_slot(index);
  params_[index].mutable_grad() = torch::Tensor();  // the full gradient is not kept (ZeRO-2)
  return true;
}

void ShardedDataParallel::setup_done() {
  param_piece_.assign(params_.size(), SIZE_MAX);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& st = *bucket_state_[b];
    if (own_rows_)
      st.shard_grad = torch::zeros({st.own_count}, params_[buckets_[b].params.front()].options().requires_grad(false));
    const int64_t own_begin = st.own_offset, own_end = st.own_offset + st.own_count;
    for (size_t i : buckets_[b].params) {
      const torch::Tensor& p = params_[i];
      if (!p.is_contiguous())
        throw ConfigError(std::string(shard_name()) + " sharding needs contiguous parameters; '" + param_names_[i] +
                          "' is not");
      const int64_t lo = std::max(own_begin, param_[i].offset), hi = std::min(own_end, param_[i].offset + p.numel());
      if (hi <= lo) continue;
      const int64_t row = row_numel(p);
      OwnedPiece piece;
      piece.index = i;
      piece.row_begin = (lo - param_[i].offset) / row;
      piece.row_end = (hi - param_[i].offset) / row;
      std::vector<int64_t> shape = p.sizes().vec();
      if (!shape.empty()) shape[0] = piece.row_end - piece.row_begin;
      if (own_rows_) {  // rows of its own: the parameter's storage is freed
        piece.tensor = torch::empty(shape, p.options().requires_grad(false));
        piece.tensor.copy_(alias(p, piece.row_begin * row, shape));
      } else {
        piece.tensor = alias(p, piece.row_begin * row, shape);
      }
      param_piece_[i] = pieces_.size();
      piece.tensor.mutable_grad() =
          keep_owned_only_ ? alias(st.shard_grad, lo - own_begin, shape) : alias(st.buffer, lo, shape);
      pieces_.push_back(std::move(piece));
    }
    if (own_rows_)  // the pieces hold this rank's rows: the parameters' storage stays empty until a unit needs it
      for (size_t i : buckets_[b].params) free_storage(params_[i]);
  }
}

void ShardedDataParallel::release_bucket(size_t b) {
  Bucket& st = *bucket_state_[b];
  if (st.released) return;
  if (st.work) {
    st.work->wait();
    st.work.reset();
  }
  if (st.own_count > 0) {
    st.shard_grad.copy_(st.buffer.narrow(0, st.own_offset, st.own_count));
    if (comm_.size() > 1) st.shard_grad.div_(static_cast<double>(comm_.size()));
  }
  st.buffer = torch::Tensor();
  for (size_t i : buckets_[b].params) param_[i].slot = torch::Tensor();
  st.released = true;
}

std::unique_ptr<Work> ShardedDataParallel::launch_reduction(size_t b) {
  Bucket& st = *bucket_state_[b];
  stats_.bytes_reduced += static_cast<size_t>(st.grad_numel) * st.buffer.element_size();
  return st.comm->reduce_scatter_async(st.buffer.data_ptr(), st.counts, to_dtype(st.buffer.scalar_type()),
                                       ReduceOp::kSum);
}

void ShardedDataParallel::after_launch() {
  // Stage 2: one bucket in flight besides the newest; older ones are waited for, kept as this rank's range, freed.
  if (keep_owned_only_)
    for (size_t b = 0; b + 1 < next_launch_; ++b) release_bucket(b);
}

double ShardedDataParallel::reductions_done(size_t unused_here) {
  if (keep_owned_only_)
    for (size_t b = 0; b < buckets_.size(); ++b) release_bucket(b);
  // Sharded buckets carry only gradients: the unused-parameter count travels in its own small allreduce.
  double total_unused = static_cast<double>(unused_here);
  if (comm_.size() > 1) comm_.allreduce(&total_unused, 1, DType::kF64, ReduceOp::kSum);
  return total_unused;
}

void ShardedDataParallel::finish_gradients(const torch::Tensor& used_map) {
  if (keep_owned_only_) return;  // release_bucket averaged this rank's range; no full gradients are kept
  const double world = comm_.size();
  if (world > 1) {
    // This rank's segment holds the sum over ranks; the rest holds this rank's own gradients: zeroed, so that
    // the next backward accumulates from zero and no stale gradient is mistaken for an average.
    for (auto& st : bucket_state_) {
      st->buffer.narrow(0, 0, st->own_offset).zero_();
      st->buffer.narrow(0, st->own_offset, st->own_count).div_(world);
      st->buffer.narrow(0, st->own_offset + st->own_count, st->grad_numel - st->own_offset - st->own_count).zero_();
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& grad = params_[i].mutable_grad();
    if (used_map.defined() && used_map[static_cast<int64_t>(i)].item<int32_t>() == 0 && !grad.defined()) continue;
    if (!grad.defined() || grad.data_ptr() != param_[i].slot.data_ptr()) grad = param_[i].slot;
  }
}

std::vector<torch::Tensor> ShardedDataParallel::owned_parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& piece : pieces_) out.push_back(piece.tensor);
  return out;
}

void ShardedDataParallel::gather_parameters() {
  H5DDP_CHECK(!armed_ || next_launch_ == 0,
              std::string(shard_name()) + " sharding: gather_parameters while gradient buckets are in flight");
  const auto t0 = Clock::now();
  torch::NoGradGuard no_grad;
  size_t next_piece = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& st = *bucket_state_[b];
    if (st.comm->size() > 1) {
      // Stage 1 gathers through the bucket (its gradients are spent); stage 2 through a buffer of one bucket.
      torch::Tensor buf = keep_owned_only_ ? torch::empty({st.grad_numel}, st.shard_grad.options()) : st.buffer;
      for (; next_piece < pieces_.size() && param_[pieces_[next_piece].index].bucket == b; ++next_piece) {
        const OwnedPiece& piece = pieces_[next_piece];
        buf.narrow(0, param_[piece.index].offset + piece.row_begin * row_numel(params_[piece.index]),
                   piece.tensor.numel())
            .copy_(piece.tensor.reshape(-1));
      }
      st.comm->allgatherv(buf.data_ptr(), st.counts, to_dtype(buf.scalar_type()));
      for (size_t i : buckets_[b].params)
        params_[i].detach().view(-1).copy_(buf.narrow(0, param_[i].offset, params_[i].numel()));
    }
    if (keep_owned_only_)
      st.shard_grad.zero_();
    else
      st.buffer.zero_();
  }
  stats_.gather_seconds += seconds_since(t0);
}

}  // namespace h5ddp

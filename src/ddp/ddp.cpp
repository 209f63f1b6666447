#include "h5ddp/ddp.hpp"

#include <c10/core/StorageImpl.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "h5ddp/clock.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"

namespace h5ddp {
namespace {

DType to_dtype(torch::ScalarType t) {
  if (auto d = dtype_of(t)) return *d;
  throw ConfigError(std::string("DDP: unsupported tensor dtype ") + c10::toString(t));
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Autograd post hook on a parameter's AccumulateGrad node: runs after .grad holds this backward's gradient.
class GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(DistributedDataParallel* ddp, size_t index) : ddp_(ddp), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ddp_->on_grad_ready(index_);
    return outputs;
  }

 private:
  DistributedDataParallel* ddp_;
  size_t index_;
};

// Broadcasts tensors from `root` through `comm`, coalesced into flat buffers of at most `chunk_bytes` per
// dtype and device, so a model with hundreds of small tensors costs a few broadcasts. Collective.
void broadcast_coalesced(Comm& host, Comm* device, const std::vector<torch::Tensor>& tensors, int root,
                         size_t chunk_bytes) {
  torch::NoGradGuard no_grad;
  std::map<std::pair<int, std::string>, std::vector<torch::Tensor>> groups;  // ordered: same on all ranks
  for (const auto& t : tensors) groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  for (auto& [key, group] : groups) {
    Comm& comm = group.front().is_cuda() ? *device : host;
    size_t i = 0;
    while (i < group.size()) {
      size_t j = i, bytes = 0;
      while (j < group.size() && (j == i || bytes + group[j].nbytes() <= chunk_bytes)) bytes += group[j++].nbytes();
      std::vector<torch::Tensor> flat_parts;
      for (size_t k = i; k < j; ++k) flat_parts.push_back(group[k].reshape(-1));
      torch::Tensor flat = torch::cat(flat_parts).contiguous();
      comm.broadcast(flat.data_ptr(), static_cast<size_t>(flat.numel()), to_dtype(flat.scalar_type()), root);
      int64_t off = 0;
      for (size_t k = i; k < j; ++k) {
        const int64_t n = group[k].numel();
        group[k].copy_(flat.narrow(0, off, n).view(group[k].sizes()));
        off += n;
      }
      i = j;
    }
  }
}

}  // namespace

std::optional<DType> dtype_of(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat:
      return DType::kF32;
    case torch::kDouble:
      return DType::kF64;
    case torch::kHalf:
      return DType::kF16;
    case torch::kBFloat16:
      return DType::kBF16;
    case torch::kLong:
      return DType::kI64;
    case torch::kInt:
      return DType::kI32;
    case torch::kShort:
      return DType::kI16;
    case torch::kChar:
      return DType::kI8;
    case torch::kByte:
      return DType::kU8;
    case torch::kBool:
      return DType::kBool;
    default:
      return std::nullopt;
  }
}

const char* shard_stage_name(ShardStage s) {
  switch (s) {
    case ShardStage::kNone:
      return "none";
    case ShardStage::kOptimizer:
      return "optimizer";
    case ShardStage::kGradients:
      return "gradients";
    case ShardStage::kParameters:
      return "parameters";
  }
  return "?";
}

struct DistributedDataParallel::Bucket {
  torch::Tensor buffer;      // flat; the last bucket has one extra trailing element (see finish_backward); stage 2:
                             // allocated for a step and freed once its reduction is done (ensure_buffer)
  torch::Tensor shard_grad;  // stage 2: this rank's range of the averaged gradients (own_count elements)
  bool released = false;     // stage 2: this step's reduction done and copied into shard_grad
  torch::Tensor wire;        // DdpOptions::reduce_bf16: the bfloat16 copy being reduced (undefined otherwise)
  int64_t grad_numel = 0;
  std::vector<size_t> counts;  // sharded: elements of each rank's range (split_bucket)
  int64_t own_offset = 0;      // sharded: this rank's range
  int64_t own_count = 0;
  size_t pending = 0;  // parameters whose gradient is not ready yet in this step
  std::unique_ptr<Work> work;
  Comm* comm = nullptr;
};

DistributedDataParallel::DistributedDataParallel(Comm& comm, torch::nn::Module& module, DdpOptions options)
    : module_(&module), comm_(comm), options_(options) {
  std::string tied;  // "'head.weight' (= 'tok.weight')": a tensor met again under another name is not a new parameter
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const auto first = std::find_if(params_.begin(), params_.end(), [&](const torch::Tensor& p) {
      return p.unsafeGetTensorImpl() == item.value().unsafeGetTensorImpl();
    });
    if (first != params_.end()) {
      tied += (tied.empty() ? "'" : ", '") + item.key() + "' (= '" + param_names_[first - params_.begin()] + "')";
      continue;
    }
    if (!item.value().requires_grad()) {
      buffers_.push_back(item.value());  // frozen parameters are only kept identical, like buffers
      continue;
    }
    params_.push_back(item.value());
    param_names_.push_back(item.key());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) buffers_.push_back(item.value());
  if (options_.stage() == ShardStage::kParameters)
    unit_problem_ = !tied.empty() ? "DDP: shard stage 3 does not run tied weights yet: " + tied +
                                        " (one tensor under two names); train this model with --shard gradients, "
                                        "optimizer or none"
                                  : resolve_units();

  check_same_model();

  const auto t0 = Clock::now();
  std::vector<torch::Tensor> all = params_;
  all.insert(all.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(comm_, options_.device_comm, all, 0, options_.bucket_cap_bytes);
  stats_.broadcast_seconds += seconds_since(t0);

  build_buckets();
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < accumulators_.size(); ++i)
    if (accumulators_[i]) accumulators_[i]->del_post_hook(hook_keys_[i]);
  // Outstanding Work (a backward without finish_backward) completes in its own destructor.
}

void DistributedDataParallel::check_same_model() {
  comm_.raise_if_any(local_model_problem());  // local problems first (agreed: every rank throws together)
  const std::vector<std::string> entries = model_signature();
  std::string joined;
  for (const auto& e : entries) joined += e + "\n";
  if (comm_.agree(fnv1a(joined))) return;
  raise_model_difference(entries, joined);
}

std::string DistributedDataParallel::local_model_problem() const {
  std::string local_error;
  bool has_cuda = false;
  for (const auto& p : params_) has_cuda = has_cuda || p.is_cuda();
  for (const auto& b : buffers_) has_cuda = has_cuda || b.is_cuda();
  if (has_cuda && options_.device_comm == nullptr)
    local_error = "DDP: the module has CUDA tensors but DdpOptions::device_comm (an NcclComm) is not set";
  if (!unit_problem_.empty()) local_error = unit_problem_;
  if (options_.device_comm && options_.device_comm->size() != comm_.size())
    local_error = "DDP: device_comm has " + std::to_string(options_.device_comm->size()) + " ranks, comm has " +
                  std::to_string(comm_.size());
  for (const auto& p : params_) {
    if (!p.is_cuda() && !p.device().is_cpu()) local_error = "DDP: unsupported device " + p.device().str();
    if (p.is_sparse()) local_error = "DDP: sparse parameters are not supported";
  }
  return local_error;
}

// Options, then each parameter and buffer as "kind name dtype[shape]".
std::vector<std::string> DistributedDataParallel::model_signature() const {
  std::vector<std::string> entries;
  entries.push_back("options first_bucket_bytes=" + std::to_string(options_.first_bucket_bytes) +
                    " bucket_cap_bytes=" + std::to_string(options_.bucket_cap_bytes) +
                    " broadcast_buffers=" + std::to_string(options_.broadcast_buffers) + " find_unused_parameters=" +
                    std::to_string(options_.find_unused_parameters) + " shard=" + shard_stage_name(options_.stage()));
  if (options_.stage() == ShardStage::kParameters)
    for (const auto& u : unit_names_) entries.front() += " unit=" + u;
  for (size_t i = 0; i < params_.size(); ++i) {
    std::ostringstream s;
    s << "parameter '" << param_names_[i] << "' " << dtype_name(to_dtype(params_[i].scalar_type()))
      << params_[i].sizes() << " on " << (params_[i].is_cuda() ? "cuda" : "cpu");
    entries.push_back(s.str());
  }
  for (const auto& item : module_->named_buffers(true)) {
    std::ostringstream s;
    s << "buffer '" << item.key() << "' " << dtype_name(to_dtype(item.value().scalar_type())) << item.value().sizes();
    entries.push_back(s.str());
  }
  for (const auto& item : module_->named_parameters(true))
    if (!item.value().requires_grad()) entries.push_back("frozen parameter '" + item.key() + "'");
  return entries;
}

void DistributedDataParallel::raise_model_difference(const std::vector<std::string>& entries,
                                                     const std::string& joined) {
  // Disagreement: every rank compares with rank 0's signature and says what differs first.
  const std::string root_sig = comm_.broadcast_string(joined, 0);
  std::vector<std::string> root_entries;
  {
    std::istringstream in(root_sig);
    for (std::string line; std::getline(in, line);) root_entries.push_back(line);
  }
  std::string diff;
  if (root_sig != joined) {
    size_t k = 0;
    while (k < entries.size() && k < root_entries.size() && entries[k] == root_entries[k]) ++k;
    const std::string mine = k < entries.size() ? entries[k] : "nothing more";
    const std::string theirs = k < root_entries.size() ? root_entries[k] : "nothing more";
    diff = "entry " + std::to_string(k) + ": rank " + std::to_string(comm_.rank()) + " has " + mine + ", rank 0 has " +
           theirs;
  }
  const int32_t differs = diff.empty() ? 0 : 1;
  std::vector<int32_t> flags(comm_.size());
  comm_.allgather(&differs, flags.data(), 1, DType::kI32);
  std::string ranks;
  int first = -1;
  for (int r = 0; r < comm_.size(); ++r)
    if (flags[r]) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      if (first < 0) first = r;
    }
  const std::string detail = comm_.broadcast_string(diff, first < 0 ? 0 : first);
  throw_agreed(DisagreementError("DistributedDataParallel: ranks built different models (rank " + ranks +
                                 " differ from rank 0); first difference on rank " + std::to_string(first) + ": " +
                                 detail));
}

Comm& DistributedDataParallel::comm_for(const torch::Device& device) const {
  return device.is_cuda() ? *options_.device_comm : comm_;
}

namespace {
// Elements per row of dimension 0 (the unit sharding cuts at): 1 for scalars, vectors and empty tensors.
int64_t row_numel(const torch::Tensor& p) {
  return p.dim() == 0 || p.size(0) == 0 ? 1 : p.numel() / p.size(0);
}

// A tensor of `shape` over `storage` from element `offset` on: an alias, not an autograd view (optimizers'
// zero_grad() calls detach_() on .grad, which LibTorch refuses for views).
torch::Tensor alias(const torch::Tensor& base, int64_t offset, c10::IntArrayRef shape) {
  return torch::empty({0}, base.options().requires_grad(false))
      .set_(base.storage(), base.storage_offset() + offset, shape, c10::contiguous_strides(shape));
}
// Stage 3: a parameter's storage emptied (its shape and autograd identity stay) and refilled. Autograd's saved
// tensors of the parameter share the storage, so a backward sees whatever it holds when it runs.
void free_storage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}
void allocate_storage(const torch::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  c10::Allocator* a = s->allocator() != nullptr ? s->allocator() : c10::GetAllocator(t.device().type());
  s->set_data_ptr_noswap(a->allocate(nbytes));
  s->set_nbytes(nbytes);
}
}  // namespace

void DistributedDataParallel::build_buckets() {
  // One group key per (dtype, device) pair, numbered in first-seen order (the same on every rank).
  std::vector<std::pair<torch::ScalarType, std::string>> keys;
  std::vector<size_t> nbytes;
  std::vector<int> group;
  for (const auto& p : params_) {
    std::pair<torch::ScalarType, std::string> k{p.scalar_type(), p.device().str()};
    auto it = std::find(keys.begin(), keys.end(), k);
    group.push_back(static_cast<int>(it - keys.begin()));
    if (it == keys.end()) keys.push_back(k);
    nbytes.push_back(p.nbytes());
  }
  if (options_.stage() == ShardStage::kParameters) {
    // ZeRO-3: a bucket per parameter (backward order), so a unit's gradients leave as soon as they are ready,
    // each reduced in autograd's own tensor (adopt_gradient), and a unit is gathered straight into its parameters.
    buckets_.clear();
    for (size_t i = params_.size(); i-- > 0;) buckets_.push_back(BucketSpec{{i}, nbytes[i]});
  } else {
    buckets_ = assign_buckets(nbytes, group, options_.first_bucket_bytes, options_.bucket_cap_bytes);
  }

  param_bucket_.assign(params_.size(), 0);
  param_offset_.assign(params_.size(), 0);
  param_slot_.assign(params_.size(), torch::Tensor());
  ready_.assign(params_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto st = std::make_unique<Bucket>();
    const auto& first = params_[buckets_[b].params.front()];
    std::vector<int64_t> numel, rows;
    for (size_t i : buckets_[b].params) {
      param_bucket_[i] = b;
      param_offset_[i] = st->grad_numel;
      st->grad_numel += params_[i].numel();
      numel.push_back(params_[i].numel());
      rows.push_back(row_numel(params_[i]));
    }
    st->comm = &comm_for(first.device());
    if (options_.sharded()) {
      const std::vector<int64_t> cuts = split_bucket(numel, rows, comm_.size());
      for (int r = 0; r < comm_.size(); ++r) st->counts.push_back(static_cast<size_t>(cuts[r + 1] - cuts[r]));
      st->own_offset = cuts[comm_.rank()];
      st->own_count = cuts[comm_.rank() + 1] - cuts[comm_.rank()];
    }
    if (options_.stage() == ShardStage::kGradients)  // stage 3: build_pieces
      st->shard_grad = torch::zeros({st->own_count}, first.options().requires_grad(false));
    bucket_state_.push_back(std::move(st));
    if (!keeps_grad_shards()) ensure_buffer(b);
  }
  if (options_.sharded()) build_pieces();

  accumulators_.resize(params_.size());
  hook_keys_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    // Holding the accumulator keeps it (and our hook) alive across iterations, as c10d's reducer does.
    accumulators_[i] = torch::autograd::impl::grad_accumulator(params_[i]);
    H5DDP_CHECK(accumulators_[i] != nullptr, "DDP: parameter '" + param_names_[i] + "' has no grad accumulator");
    hook_keys_[i] = accumulators_[i]->add_post_hook(std::make_unique<GradReadyHook>(this, i));
  }
}

void DistributedDataParallel::ensure_buffer(size_t b) {
  Bucket& st = *bucket_state_[b];
  if (st.buffer.defined()) return;
  const bool last = b + 1 == buckets_.size() && !options_.sharded();  // sharded: no unused count in the bucket
  st.buffer = torch::zeros({st.grad_numel + (last ? 1 : 0)},
                           params_[buckets_[b].params.front()].options().requires_grad(false));
  for (size_t i : buckets_[b].params) param_slot_[i] = alias(st.buffer, param_offset_[i], params_[i].sizes());
}

bool DistributedDataParallel::adopt_gradient(size_t index) {
  // ZeRO-2, a bucket of one parameter: its fresh gradient (autograd's, which nothing else reads) becomes the
  // bucket's buffer, reduced in place: no second copy of the largest tensors while they are in flight.
  const size_t b = param_bucket_[index];
  Bucket& st = *bucket_state_[b];
  const torch::Tensor& grad = params_[index].grad();
  if (buckets_[b].params.size() != 1 || st.buffer.defined() || !grad.defined() || grad.is_sparse() ||
      !grad.is_contiguous() || grad.scalar_type() != params_[index].scalar_type() ||
      grad.device() != params_[index].device() || grad.numel() != st.grad_numel)
    return false;
  st.buffer = grad.detach().view({-1});
  param_slot_[index] = grad.detach();
  params_[index].mutable_grad() = torch::Tensor();
  return true;
}

void DistributedDataParallel::build_pieces() {
  param_piece_.assign(params_.size(), SIZE_MAX);
  const bool stage3 = options_.stage() == ShardStage::kParameters;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& st = *bucket_state_[b];
    if (stage3)  // allocated as the parameters are freed, so the model is never held twice over
      st.shard_grad = torch::zeros({st.own_count}, params_[buckets_[b].params.front()].options().requires_grad(false));
    const int64_t own_begin = st.own_offset, own_end = st.own_offset + st.own_count;
    for (size_t i : buckets_[b].params) {
      const torch::Tensor& p = params_[i];
      if (!p.is_contiguous())
        throw ConfigError("DDP: sharding needs contiguous parameters; '" + param_names_[i] + "' is not");
      const int64_t lo = std::max(own_begin, param_offset_[i]), hi = std::min(own_end, param_offset_[i] + p.numel());
      if (hi <= lo) continue;
      const int64_t row = row_numel(p);
      OwnedPiece piece;
      piece.index = i;
      piece.row_begin = (lo - param_offset_[i]) / row;
      piece.row_end = (hi - param_offset_[i]) / row;
      std::vector<int64_t> shape = p.sizes().vec();
      if (!shape.empty()) shape[0] = piece.row_end - piece.row_begin;
      if (options_.stage() == ShardStage::kParameters) {  // rows of its own: the parameter's storage is freed
        piece.tensor = torch::empty(shape, p.options().requires_grad(false));
        piece.tensor.copy_(alias(p, piece.row_begin * row, shape));
        param_piece_[i] = pieces_.size();
      } else {
        piece.tensor = alias(p, piece.row_begin * row, shape);
      }
      piece.tensor.mutable_grad() =
          keeps_grad_shards() ? alias(st.shard_grad, lo - own_begin, shape) : alias(st.buffer, lo, shape);
      pieces_.push_back(std::move(piece));
    }
    if (stage3)  // the pieces hold this rank's rows: the parameter's storage stays empty until run_unit needs it
      for (size_t i : buckets_[b].params) free_storage(params_[i]);
  }
}

void DistributedDataParallel::release_bucket(size_t b) {
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
  for (size_t i : buckets_[b].params) param_slot_[i] = torch::Tensor();
  st.released = true;
}

void DistributedDataParallel::prepare_forward() {
  if (no_sync_) return;
  H5DDP_CHECK(!armed_ || next_launch_ == 0,
              "DDP: prepare_forward called while the previous step's buckets are in flight; call finish_backward "
              "after every backward");
  if (options_.broadcast_buffers && !buffers_.empty()) {
    const auto t0 = Clock::now();
    broadcast_coalesced(comm_, options_.device_comm, buffers_, 0, options_.bucket_cap_bytes);
    stats_.broadcast_seconds += seconds_since(t0);
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    bucket_state_[b]->pending = buckets_[b].params.size();
    bucket_state_[b]->released = false;
  }
  next_launch_ = 0;
  armed_ = true;
}

void DistributedDataParallel::sync_buffers() {
  if (buffers_.empty()) return;
  const auto t0 = Clock::now();
  broadcast_coalesced(comm_, options_.device_comm, buffers_, 0, options_.bucket_cap_bytes);
  stats_.broadcast_seconds += seconds_since(t0);
}

void DistributedDataParallel::on_grad_ready(size_t index) {
  if (no_sync_) {  // gradients accumulate in .grad locally
    if (options_.stage() == ShardStage::kParameters) note_unit_grad(index);
    return;
  }
  // CUDA backward runs hooks on per-device autograd threads; a module on several devices needs the lock.
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_)
    throw ConfigError("DDP: backward reached parameter '" + param_names_[index] +
                      "' without prepare_forward(); call it before every synchronised forward");
  if (ready_[index])
    throw ConfigError("DDP: the gradient of '" + param_names_[index] +
                      "' was produced twice in one step (two backward passes?); call finish_backward "
                      "after each backward, or use no_sync() for gradient accumulation");
  const size_t b = param_bucket_[index];
  const bool stage2 = keeps_grad_shards();
  if (stage2 && adopt_gradient(index)) {
    finish_grad_ready(index, b);
    return;
  }
  if (stage2) ensure_buffer(b);
  const torch::Tensor& grad = params_[index].grad();
  const torch::Tensor& slot = param_slot_[index];
  if (!grad.defined()) {
    slot.zero_();
  } else {
    H5DDP_CHECK(!grad.is_sparse(), "DDP: sparse gradient for '" + param_names_[index] + "' is not supported");
    // After the first synchronised step .grad is a view of the bucket, so accumulation already put it there.
    if (!grad.is_same(slot) && grad.data_ptr() != slot.data_ptr()) slot.copy_(grad);
  }
  if (stage2) params_[index].mutable_grad() = torch::Tensor();  // the full gradient is not kept (ZeRO-2)
  finish_grad_ready(index, b);
}

void DistributedDataParallel::finish_grad_ready(size_t index, size_t b) {
  ready_[index] = 1;
  --bucket_state_[b]->pending;
  if (bucket_state_[b]->pending == 0) launch_ready_buckets(/*from_hook=*/true);
  drive_progress();
  if (options_.stage() == ShardStage::kParameters) note_unit_grad(index);
}

void DistributedDataParallel::launch_ready_buckets(bool from_hook) {
  // Strictly in bucket order, so the asynchronous allreduces match across ranks.
  while (next_launch_ < buckets_.size() && bucket_state_[next_launch_]->pending == 0) launch(next_launch_++, from_hook);
  // ZeRO-2: one bucket in flight besides the newest; older ones are waited for, kept as this rank's range, freed.
  if (keeps_grad_shards())
    for (size_t b = 0; b + 1 < next_launch_; ++b) release_bucket(b);
}

void DistributedDataParallel::launch(size_t b, bool from_hook) {
  Bucket& st = *bucket_state_[b];
  // Launched from a hook, the last bucket means every parameter was used; finish_backward writes the count
  // itself before it launches the rest.
  if (from_hook && b + 1 == buckets_.size() && !options_.sharded()) st.buffer.narrow(0, st.grad_numel, 1).zero_();
  ++stats_.buckets_launched;
  if (from_hook) ++stats_.buckets_launched_in_backward;
  if (st.comm->size() == 1) return;  // nothing to average with; the bucket already holds the result
  if (options_.sharded()) {
    st.work = st.comm->reduce_scatter_async(st.buffer.data_ptr(), st.counts, to_dtype(st.buffer.scalar_type()),
                                            ReduceOp::kSum);
    stats_.bytes_reduced += static_cast<size_t>(st.grad_numel) * st.buffer.element_size();
    return;
  }
  torch::Tensor& sent = options_.reduce_bf16 && st.buffer.is_cuda() && st.buffer.scalar_type() == torch::kFloat32
                            ? (st.wire = st.buffer.to(torch::kBFloat16))
                            : st.buffer;
  st.work = st.comm->allreduce_async(sent.data_ptr(), static_cast<size_t>(sent.numel()), to_dtype(sent.scalar_type()),
                                     ReduceOp::kSum);
  stats_.bytes_reduced += sent.nbytes();
}

void DistributedDataParallel::drive_progress() {
  // Open MPI's non-blocking collectives advance only inside MPI calls: poke the oldest one in flight.
  for (size_t b = 0; b < next_launch_; ++b) {
    Bucket& st = *bucket_state_[b];
    if (st.work && !st.work->test()) return;
  }
}

void DistributedDataParallel::finish_backward() {
  if (no_sync_) return;
  H5DDP_CHECK(armed_, "DDP: finish_backward without prepare_forward()");
  const auto t0 = Clock::now();
  torch::NoGradGuard no_grad;

  const std::vector<size_t> unused = flush_unused();
  torch::Tensor used_map;
  std::unique_ptr<Work> used_work;
  if (options_.find_unused_parameters) {
    used_map = torch::ones({static_cast<int64_t>(params_.size())}, torch::kInt32);
    for (size_t i : unused) used_map[static_cast<int64_t>(i)] = 0;
    used_work = comm_.allreduce_async(used_map.data_ptr(), params_.size(), DType::kI32, ReduceOp::kSum);
  }
  double total_unused = wait_for_reductions(unused.size(), used_work.get());
  for (size_t u = 0; u < unit_gathered_.size(); ++u) release_unit(u);  // a unit some gradient never reached
  armed_ = false;
  next_launch_ = 0;
  average_gradients();
  point_grads_at_buckets(used_map);
  ++stats_.steps;
  stats_.finish_seconds += seconds_since(t0);
  // Checked last, so that even after this error every .grad holds the step's average (usable state).
  if (!options_.find_unused_parameters && !buckets_.empty()) {
    if (!options_.sharded()) {
      Bucket& last = *bucket_state_.back();
      total_unused = last.buffer.narrow(0, last.grad_numel, 1).item<double>();
    }
    if (total_unused > 0.5) raise_unused(unused);
  }
}

std::vector<size_t> DistributedDataParallel::flush_unused() {
  // Parameters whose hook never fired contribute their current .grad (zeros if undefined).
  std::vector<size_t> unused;
  for (size_t b = next_launch_; b < buckets_.size(); ++b)
    for (size_t i : buckets_[b].params)
      if (!ready_[i]) {
        if (keeps_grad_shards()) ensure_buffer(b);
        unused.push_back(i);
        const torch::Tensor& grad = params_[i].grad();
        if (!grad.defined())
          param_slot_[i].zero_();
        else if (grad.data_ptr() != param_slot_[i].data_ptr())
          param_slot_[i].copy_(grad);
        ready_[i] = 1;
        --bucket_state_[b]->pending;
      }
  // The last bucket carries one extra element: the number of unused parameters on this rank. Its sum tells
  // every rank, with no extra collective, whether any rank has unused parameters.
  if (next_launch_ < buckets_.size() && !options_.sharded()) {  // sharded: its own allreduce (wait_for_reductions)
    Bucket& last = *bucket_state_.back();
    last.buffer.narrow(0, last.grad_numel, 1).fill_(static_cast<double>(unused.size()));
  }
  launch_ready_buckets(/*from_hook=*/false);
  return unused;
}

double DistributedDataParallel::wait_for_reductions(size_t unused_here, Work* used_work) {
  const auto tw = Clock::now();
  if (keeps_grad_shards())
    for (size_t b = 0; b < buckets_.size(); ++b) release_bucket(b);
  for (auto& st : bucket_state_) {
    if (!st->work) continue;
    st->work->wait();
    st->work.reset();
    if (st->wire.defined()) {  // widened back on the caller's stream, ordered after the reduction
      st->buffer.copy_(st->wire);
      st->wire.reset();
    }
  }
  if (used_work) used_work->wait();
  // Sharded buckets carry only gradients: the unused-parameter count travels in its own small allreduce.
  double total_unused = 0;
  if (options_.sharded() && !buckets_.empty()) {
    total_unused = static_cast<double>(unused_here);
    if (comm_.size() > 1) comm_.allreduce(&total_unused, 1, DType::kF64, ReduceOp::kSum);
  }
  stats_.comm_wait_seconds += seconds_since(tw);
  return total_unused;
}

void DistributedDataParallel::average_gradients() {
  const double world = comm_.size();
  if (keeps_grad_shards()) return;  // release_bucket averaged this rank's range
  if (world > 1 && options_.sharded()) {
    // This rank's segment holds the sum over ranks; the rest holds this rank's own gradients: zeroed, so that
    // the next backward accumulates from zero and no stale gradient is mistaken for an average.
    for (auto& st : bucket_state_) {
      st->buffer.narrow(0, 0, st->own_offset).zero_();
      st->buffer.narrow(0, st->own_offset, st->own_count).div_(world);
      st->buffer.narrow(0, st->own_offset + st->own_count, st->grad_numel - st->own_offset - st->own_count).zero_();
    }
  } else if (world > 1) {
    for (auto& st : bucket_state_) st->buffer.narrow(0, 0, st->grad_numel).div_(world);
  }
}

void DistributedDataParallel::point_grads_at_buckets(const torch::Tensor& used_map) {
  if (keeps_grad_shards()) return;  // ZeRO-2 keeps no full gradients
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& grad = params_[i].mutable_grad();
    if (used_map.defined() && used_map[static_cast<int64_t>(i)].item<int32_t>() == 0 && !grad.defined()) continue;
    // .grad becomes a view of the bucket: the next backward accumulates straight into it (no copy-in).
    if (!grad.defined() || grad.data_ptr() != param_slot_[i].data_ptr()) grad = param_slot_[i];
  }
}

std::vector<torch::Tensor> DistributedDataParallel::owned_parameters() const {
  if (!options_.sharded()) return params_;
  std::vector<torch::Tensor> out;
  for (const auto& piece : pieces_) out.push_back(piece.tensor);
  return out;
}

double DistributedDataParallel::clip_grad_norm(double max_norm) {
  H5DDP_CHECK(max_norm > 0, "DDP: clip_grad_norm needs max_norm > 0");
  H5DDP_CHECK(!no_sync_, "DDP: clip_grad_norm inside no_sync (the gradients are not reduced yet)");
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : owned_parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& g : grads) norms.push_back(torch::norm(g, 2));
  double total = 0;
  if (options_.sharded()) {  // this rank's squared share, summed over ranks: the sum is already agreed
    double squares = norms.empty() ? 0.0 : torch::stack(norms).to(torch::kDouble).pow(2).sum().item<double>();
    comm_.allreduce(&squares, 1, DType::kF64, ReduceOp::kSum);
    total = std::sqrt(squares);
  } else {  // every rank computed it from the same gradients; the max makes it one value regardless
    if (!norms.empty()) total = torch::norm(torch::stack(norms), 2).item<double>();
    const bool finite = std::isfinite(total);
    double agreed[2] = {finite ? total : 0.0, finite ? 0.0 : 1.0};
    comm_.allreduce(agreed, 2, DType::kF64, ReduceOp::kMax);
    total = agreed[1] > 0 ? std::numeric_limits<double>::quiet_NaN() : agreed[0];
  }
  if (!std::isfinite(total)) return std::numeric_limits<double>::quiet_NaN();
  if (grads.empty()) return total;
  const torch::Tensor total_t = torch::full({}, total, grads.front().options());
  // PyTorch: clip_coef = max_norm / (total_norm + 1e-6), where float / tensor is tensor.reciprocal() * float.
  const torch::Tensor coef = torch::clamp((total_t + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0);
  for (torch::Tensor& g : grads) g.mul_(coef);
  return total;
}

void DistributedDataParallel::gather_parameters() {
  H5DDP_CHECK(options_.sharded(), "DDP: gather_parameters needs DdpOptions::shard");
  H5DDP_CHECK(!armed_ || next_launch_ == 0, "DDP: gather_parameters while gradient buckets are in flight");
  const auto t0 = Clock::now();
  torch::NoGradGuard no_grad;
  const bool stage2 = keeps_grad_shards();
  size_t next_piece = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& st = *bucket_state_[b];
    if (st.comm->size() > 1 && options_.stage() != ShardStage::kParameters) {  // stage 3: run_unit gathers
      // Stage 1 gathers through the bucket (its gradients are spent); stage 2 through a buffer of one bucket.
      torch::Tensor buf = stage2 ? torch::empty({st.grad_numel}, st.shard_grad.options()) : st.buffer;
      for (; next_piece < pieces_.size() && param_bucket_[pieces_[next_piece].index] == b; ++next_piece) {
        const OwnedPiece& piece = pieces_[next_piece];
        buf.narrow(0, param_offset_[piece.index] + piece.row_begin * row_numel(params_[piece.index]),
                   piece.tensor.numel())
            .copy_(piece.tensor.reshape(-1));
      }
      st.comm->allgatherv(buf.data_ptr(), st.counts, to_dtype(buf.scalar_type()));
      for (size_t i : buckets_[b].params)
        params_[i].detach().view(-1).copy_(buf.narrow(0, param_offset_[i], params_[i].numel()));
    }
    if (stage2)
      st.shard_grad.zero_();
    else
      st.buffer.zero_();
  }
  stats_.gather_seconds += seconds_since(t0);
}

std::string DistributedDataParallel::resolve_units() {
  unit_names_ = options_.units;
  if (unit_names_.empty())
    for (const auto& child : module_->named_children())
      if (!child.value()->parameters(/*recurse=*/true).empty()) unit_names_.push_back(child.key());
  unit_params_.assign(unit_names_.size(), {});
  param_unit_.assign(params_.size(), SIZE_MAX);
  param_nbytes_.assign(params_.size(), 0);
  unit_gathered_.assign(unit_names_.size(), 0);
  unit_left_.assign(unit_names_.size(), 0);
  std::string loose, units;
  for (const auto& n : unit_names_) units += (units.empty() ? "'" : ", '") + n + "'";
  std::vector<const void*> storages;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i];
    const std::string& name = param_names_[i];
    for (size_t u = 0; u < unit_names_.size(); ++u) {
      if (name.compare(0, unit_names_[u].size() + 1, unit_names_[u] + ".") != 0) continue;
      if (param_unit_[i] != SIZE_MAX)
        return "DDP: parameter '" + name + "' is in two units, '" + unit_names_[param_unit_[i]] + "' and '" +
               unit_names_[u] + "'";
      param_unit_[i] = u;
      unit_params_[u].push_back(i);
    }
    if (param_unit_[i] == SIZE_MAX) loose += (loose.empty() ? "'" : ", '") + name + "'";
    const void* storage = p.storage().unsafeGetStorageImpl();
    if (p.storage_offset() != 0 || p.storage().nbytes() != p.nbytes() || !p.is_contiguous() ||
        std::find(storages.begin(), storages.end(), storage) != storages.end())
      return "DDP: shard stage 3 frees each parameter's storage between uses, so each must own its storage "
             "whole; '" +
             name + "' is a view of, or shares, another tensor's";
    storages.push_back(storage);
    param_nbytes_[i] = p.nbytes();
  }
  if (!loose.empty())
    return "DDP: shard stage 3 runs the model unit by unit (units: " + (units.empty() ? "none" : units) +
           "), and no unit holds the parameters " + loose + " (DdpOptions::units lists module names)";
  return "";
}

torch::Tensor DistributedDataParallel::run_unit(const std::string& unit,
                                                const std::function<torch::Tensor()>& forward) {
  if (options_.stage() != ShardStage::kParameters) return forward();
  auto it = std::find(unit_names_.begin(), unit_names_.end(), unit);
  if (it == unit_names_.end()) throw ConfigError("DDP: run_unit: '" + unit + "' is not a unit of the model");
  const size_t u = static_cast<size_t>(it - unit_names_.begin());
  gather_unit(u);
  torch::Tensor out;
  try {
    out = forward();
  } catch (...) {
    release_unit(u);
    throw;
  }
  // Autograd reaches the hook with the output's gradient, before the unit's own backward: gather it again then.
  if (out.defined() && out.requires_grad()) out.register_hook([this, u](const torch::Tensor&) { regather_unit(u); });
  release_unit(u);
  return out;
}

std::vector<torch::Tensor> DistributedDataParallel::full_parameters() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out(params_.size());
  if (options_.stage() != ShardStage::kParameters) {
    for (size_t i = 0; i < params_.size(); ++i) out[i] = params_[i].detach().clone();
    return out;
  }
  for (size_t u = 0; u < unit_params_.size(); ++u) {
    const bool was = unit_gathered_[u] != 0;
    gather_unit(u);
    for (size_t i : unit_params_[u]) out[i] = params_[i].detach().clone();
    if (!was) release_unit(u);
  }
  return out;
}

void DistributedDataParallel::regather_unit(size_t u) {
  gather_unit(u);
  // The gradients of the units after this one were launched while this gather ran; keeping only this rank's range
  // of them now, before this unit's backward allocates its own, holds one unit's gradients at a time.
  std::lock_guard<std::mutex> lock(mutex_);
  if (armed_ && !no_sync_)
    for (size_t b = 0; b < next_launch_; ++b) release_bucket(b);
}

void DistributedDataParallel::gather_unit(size_t u) {
  if (unit_gathered_[u]) return;
  const auto t0 = Clock::now();
  torch::NoGradGuard no_grad;
  for (size_t i : unit_params_[u]) {
    const torch::Tensor& p = params_[i];
    allocate_storage(p, param_nbytes_[i]);
    if (param_piece_[i] != SIZE_MAX) {  // this rank's rows first, through an alias (the parameter's version stays)
      const OwnedPiece& piece = pieces_[param_piece_[i]];
      alias(p, piece.row_begin * row_numel(p), piece.tensor.sizes()).copy_(piece.tensor);
    }
    Bucket& st = *bucket_state_[param_bucket_[i]];
    if (st.comm->size() > 1) st.comm->allgatherv(p.data_ptr(), st.counts, to_dtype(p.scalar_type()));
  }
  unit_gathered_[u] = 1;
  unit_left_[u] = unit_params_[u].size();
  ++stats_.unit_gathers;
  stats_.gather_seconds += seconds_since(t0);
}

void DistributedDataParallel::release_unit(size_t u) {
  if (!unit_gathered_[u]) return;
  for (size_t i : unit_params_[u]) free_storage(params_[i]);
  unit_gathered_[u] = 0;
}

void DistributedDataParallel::note_unit_grad(size_t index) {
  const size_t u = param_unit_[index];
  if (unit_left_[u] > 0 && --unit_left_[u] == 0) release_unit(u);
}

void DistributedDataParallel::raise_unused(const std::vector<size_t>& unused_local) {
  // Collective: every rank reached here (the count came from an allreduce). Name the lowest such rank's list.
  std::string names;
  for (size_t i : unused_local) names += (names.empty() ? "'" : ", '") + param_names_[i] + "'";
  int32_t first = unused_local.empty() ? comm_.size() : comm_.rank();
  comm_.allreduce(&first, 1, DType::kI32, ReduceOp::kMin);
  const std::string list = comm_.broadcast_string(names, first);
  throw ConfigError("DistributedDataParallel: parameters got no gradient in this step on rank " +
                    std::to_string(first) + ": " + list +
                    " (set DdpOptions::find_unused_parameters=true if the model skips them on purpose)");
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp) : ddp_(&ddp), previous_(ddp.no_sync_) {
  ddp.no_sync_ = true;
}
DistributedDataParallel::NoSync::~NoSync() {
  if (ddp_) ddp_->no_sync_ = previous_;
}
DistributedDataParallel::NoSync::NoSync(NoSync&& other) noexcept : ddp_(other.ddp_), previous_(other.previous_) {
  other.ddp_ = nullptr;
}

std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : module.parameters(/*recurse=*/true))
    if (std::none_of(out.begin(), out.end(),
                     [&](const torch::Tensor& q) { return q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl(); }))
      out.push_back(p);
  return out;
}

}  // namespace h5ddp

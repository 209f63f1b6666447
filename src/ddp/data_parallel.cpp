#include "h5ddp/data_parallel.hpp"

#include <c10/util/strides.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ddp/broadcast.hpp"
#include "h5ddp/clock.hpp"
#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

// Autograd post hook on a parameter's AccumulateGrad node: runs after .grad holds this backward's gradient.
class GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(DataParallel* dp, size_t index) : dp_(dp), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    dp_->on_grad_ready(index_);
    return outputs;
  }

 private:
  DataParallel* dp_;
  size_t index_;
};

}  // namespace

// Holding the accumulator keeps it (and our hook) alive across iterations, as c10d's reducer does.
struct DataParallel::Hook {
  std::shared_ptr<torch::autograd::Node> accumulator;
  uintptr_t key = 0;
};

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

std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : module.parameters(/*recurse=*/true))
    if (std::none_of(out.begin(), out.end(),
                     [&](const torch::Tensor& q) { return q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl(); }))
      out.push_back(p);
  return out;
}

DType DataParallel::to_dtype(torch::ScalarType t) {
  if (auto d = dtype_of(t)) return *d;
  throw ConfigError(std::string("DDP: unsupported tensor dtype ") + c10::toString(t));
}

// Elements per row of dimension 0 (the unit sharding cuts at): 1 for scalars, vectors and empty tensors.
int64_t DataParallel::row_numel(const torch::Tensor& p) {
  return p.dim() == 0 || p.size(0) == 0 ? 1 : p.numel() / p.size(0);
}

torch::Tensor DataParallel::alias(const torch::Tensor& base, int64_t offset, c10::IntArrayRef shape) {
  return torch::empty({0}, base.options().requires_grad(false))
      .set_(base.storage(), base.storage_offset() + offset, shape, c10::contiguous_strides(shape));
}

DataParallel::DataParallel(Comm& comm, torch::nn::Module& module, DdpOptions options, std::string kind)
    : module_(&module), comm_(comm), options_(options), kind_(std::move(kind)) {
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    // A tensor met again under another name (a tied weight) is not a new parameter: its name is an alias.
    const auto first = std::find_if(params_.begin(), params_.end(), [&](const torch::Tensor& p) {
      return p.unsafeGetTensorImpl() == item.value().unsafeGetTensorImpl();
    });
    if (first != params_.end()) {
      param_aliases_[static_cast<size_t>(first - params_.begin())].push_back(item.key());
      continue;
    }
    if (!item.value().requires_grad()) {
      if (std::none_of(buffers_.begin(), buffers_.end(),
                       [&](const torch::Tensor& b) { return b.is_same(item.value()); }))
        buffers_.push_back(item.value());  // frozen parameters are only kept identical, like buffers
      continue;
    }
    params_.push_back(item.value());
    param_names_.push_back(item.key());
    param_aliases_.emplace_back();
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) buffers_.push_back(item.value());
}

DataParallel::~DataParallel() {
  for (const auto& hook : hooks_)
    if (hook->accumulator) hook->accumulator->del_post_hook(hook->key);
  // Outstanding Work (a backward without finish_backward) completes in its own destructor.
}

std::vector<BucketSpec> DataParallel::layout(const std::vector<size_t>& nbytes, const std::vector<int>& group) const {
  return assign_buckets(nbytes, group, options_.first_bucket_bytes, options_.bucket_cap_bytes);
}

void DataParallel::build() {
  const auto t0 = Clock::now();
  std::vector<torch::Tensor> all = params_;
  all.insert(all.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(comm_, options_.device_comm, all, 0, options_.bucket_cap_bytes);
  stats_.broadcast_seconds += seconds_since(t0);

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
  buckets_ = layout(nbytes, group);
  param_.assign(params_.size(), ParamSlot{});
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto st = std::make_unique<Bucket>();
    for (size_t i : buckets_[b].params) {
      param_[i].bucket = b;
      param_[i].offset = st->grad_numel;
      st->grad_numel += params_[i].numel();
    }
    const torch::Tensor& first = params_[buckets_[b].params.front()];
    st->comm = first.is_cuda() ? options_.device_comm : &comm_;
    bucket_state_.push_back(std::move(st));
    setup_bucket(b);
  }
  setup_done();

  for (size_t i = 0; i < params_.size(); ++i) {
    auto hook = std::make_unique<Hook>();
    hook->accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    H5DDP_CHECK(hook->accumulator != nullptr, kind_ + ": parameter '" + param_names_[i] + "' has no grad accumulator");
    hook->key = hook->accumulator->add_post_hook(std::make_unique<GradReadyHook>(this, i));
    hooks_.push_back(std::move(hook));
  }
}

void DataParallel::prepare_forward() {
  if (no_sync_) return;
  H5DDP_CHECK(!armed_ || next_launch_ == 0,
              kind_ +
                  ": prepare_forward called while the previous step's buckets are in flight; call "
                  "finish_backward after every backward");
  if (options_.broadcast_buffers && !buffers_.empty()) {
    const auto t0 = Clock::now();
    broadcast_coalesced(comm_, options_.device_comm, buffers_, 0, options_.bucket_cap_bytes);
    stats_.broadcast_seconds += seconds_since(t0);
  }
  for (auto& p : param_) p.ready = false;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    bucket_state_[b]->pending = buckets_[b].params.size();
    bucket_state_[b]->released = false;
  }
  next_launch_ = 0;
  armed_ = true;
}

void DataParallel::sync_buffers() {
  if (buffers_.empty()) return;
  const auto t0 = Clock::now();
  broadcast_coalesced(comm_, options_.device_comm, buffers_, 0, options_.bucket_cap_bytes);
  stats_.broadcast_seconds += seconds_since(t0);
}

void DataParallel::copy_into_slot(size_t index) {
  const torch::Tensor& grad = params_[index].grad();
  const torch::Tensor& slot = param_[index].slot;
  if (!grad.defined()) {
    slot.zero_();
    return;
  }
  H5DDP_CHECK(!grad.is_sparse(), kind_ + ": sparse gradient for '" + param_names_[index] + "' is not supported");
  // After the first synchronised step .grad is a view of the bucket, so accumulation already put it there.
  if (!grad.is_same(slot) && grad.data_ptr() != slot.data_ptr()) slot.copy_(grad);
}

void DataParallel::on_grad_ready(size_t index) {
  if (no_sync_) {  // gradients accumulate in .grad locally
    gradient_done(index);
    return;
  }
  // CUDA backward runs hooks on per-device autograd threads; a module on several devices needs the lock.
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_)
    throw ConfigError(kind_ + ": backward reached parameter '" + param_names_[index] +
                      "' without prepare_forward(); call it before every synchronised forward");
  if (param_[index].ready)
    throw ConfigError(kind_ + ": the gradient of '" + param_names_[index] +
                      "' was produced twice in one step (two backward passes?); call finish_backward "
                      "after each backward, or use no_sync() for gradient accumulation");
  if (!store_gradient(index)) copy_into_slot(index);
  param_[index].ready = true;
  const size_t b = param_[index].bucket;
  if (--bucket_state_[b]->pending == 0) launch_ready_buckets(/*from_hook=*/true);
  drive_progress();
  gradient_done(index);
}

void DataParallel::launch_ready_buckets(bool from_hook) {
  // Strictly in bucket order, so the asynchronous reductions match across ranks.
  while (next_launch_ < buckets_.size() && bucket_state_[next_launch_]->pending == 0) {
    const size_t b = next_launch_++;
    Bucket& st = *bucket_state_[b];
    // Launched from a hook, the last bucket means every parameter was used; finish_backward writes the count
    // itself before it launches the rest.
    if (from_hook && b + 1 == buckets_.size() && counts_unused_in_last_bucket())
      st.buffer.narrow(0, st.grad_numel, 1).zero_();
    ++stats_.buckets_launched;
    if (from_hook) ++stats_.buckets_launched_in_backward;
    if (st.comm->size() > 1) st.work = launch_reduction(b);  // one rank: the bucket already holds the result
  }
  after_launch();
}

void DataParallel::drive_progress() {
  // Open MPI's non-blocking collectives advance only inside MPI calls: poke the oldest one in flight.
  for (size_t b = 0; b < next_launch_; ++b) {
    Bucket& st = *bucket_state_[b];
    if (st.work && !st.work->test()) return;
  }
}

void DataParallel::finish_backward() {
  if (no_sync_) return;
  H5DDP_CHECK(armed_, kind_ + ": finish_backward without prepare_forward()");
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
  const auto tw = Clock::now();
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
  const double total_unused = buckets_.empty() ? 0.0 : reductions_done(unused.size());
  stats_.comm_wait_seconds += seconds_since(tw);
  armed_ = false;
  next_launch_ = 0;
  finish_gradients(used_map);
  ++stats_.steps;
  stats_.finish_seconds += seconds_since(t0);
  // Checked last, so that even after this error every gradient holds the step's average (usable state).
  if (!options_.find_unused_parameters && total_unused > 0.5) raise_unused(unused);
}

std::vector<size_t> DataParallel::flush_unused() {
  // Parameters whose hook never fired contribute their current .grad (zeros if undefined).
  std::vector<size_t> unused;
  for (size_t b = next_launch_; b < buckets_.size(); ++b)
    for (size_t i : buckets_[b].params)
      if (!param_[i].ready) {
        ensure_bucket(b);
        unused.push_back(i);
        copy_into_slot(i);
        param_[i].ready = true;
        --bucket_state_[b]->pending;
      }
  // The last bucket may carry one extra element: the number of unused parameters on this rank. Its sum tells
  // every rank, with no extra collective, whether any rank has unused parameters.
  if (next_launch_ < buckets_.size() && counts_unused_in_last_bucket()) {
    Bucket& last = *bucket_state_.back();
    last.buffer.narrow(0, last.grad_numel, 1).fill_(static_cast<double>(unused.size()));
  }
  launch_ready_buckets(/*from_hook=*/false);
  return unused;
}

std::vector<torch::Tensor> DataParallel::full_parameters() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  for (const auto& p : params_) out.push_back(p.detach().clone());
  return out;
}

double DataParallel::clip_grad_norm(double max_norm) {
  H5DDP_CHECK(max_norm > 0, kind_ + ": clip_grad_norm needs max_norm > 0");
  H5DDP_CHECK(!no_sync_, kind_ + ": clip_grad_norm inside no_sync (the gradients are not reduced yet)");
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : owned_parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& g : grads) norms.push_back(torch::norm(g, 2));
  double total = 0;
  if (gradients_are_split()) {  // this rank's squared share, summed over ranks: the sum is already agreed
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

void DataParallel::raise_unused(const std::vector<size_t>& unused_local) {
  // Collective: every rank reached here (the count came from an allreduce). Name the lowest such rank's list.
  std::string names;
  for (size_t i : unused_local) names += (names.empty() ? "'" : ", '") + param_names_[i] + "'";
  int32_t first = unused_local.empty() ? comm_.size() : comm_.rank();
  comm_.allreduce(&first, 1, DType::kI32, ReduceOp::kMin);
  const std::string list = comm_.broadcast_string(names, first);
  throw ConfigError(kind_ + ": parameters got no gradient in this step on rank " + std::to_string(first) + ": " + list +
                    " (set DdpOptions::find_unused_parameters=true if the model skips them on purpose)");
}

DataParallel::NoSync::NoSync(DataParallel& dp) : dp_(&dp), previous_(dp.no_sync_) {
  dp.no_sync_ = true;
}
DataParallel::NoSync::~NoSync() {
  if (dp_) dp_->no_sync_ = previous_;
}
DataParallel::NoSync::NoSync(NoSync&& other) noexcept : dp_(other.dp_), previous_(other.previous_) {
  other.dp_ = nullptr;
}

}  // namespace h5ddp

#include "h5ddp/fsdp.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <set>

#include "h5ddp/clock.hpp"
#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

using ImplSet = std::set<const void*>;

// Parameter elements in `m` and below, each tensor once (counted into `seen`).
int64_t subtree_params(const torch::nn::Module& m, ImplSet& seen) {
  int64_t n = 0;
  for (const auto& p : m.parameters(/*recurse=*/true))
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  return n;
}

bool children_hold_parameters(const torch::nn::Module& m) {
  for (const auto& c : m.children())
    if (!c->parameters(/*recurse=*/true).empty()) return true;
  return false;
}

void pick_units(const torch::nn::Module& m, const std::string& name, int64_t max_params,
                std::vector<std::string>& out) {
  for (const auto& child : m.named_children()) {
    const std::string path = name.empty() ? child.key() : name + "." + child.key();
    const torch::nn::Module& c = *child.value();
    ImplSet seen;
    const int64_t n = subtree_params(c, seen);
    if (n == 0) continue;
    if (n <= max_params || !children_hold_parameters(c))
      out.push_back(path);
    else
      pick_units(c, path, max_params, out);
  }
}

bool under(const std::string& name, const std::string& unit) {
  return name.size() > unit.size() && name.compare(0, unit.size(), unit) == 0 && name[unit.size()] == '.';
}

}  // namespace

std::vector<std::string> units_by_size(const torch::nn::Module& module, int64_t max_params) {
  if (max_params <= 0) {
    ImplSet seen;
    max_params = std::max<int64_t>(1, subtree_params(module, seen) / 4);
  }
  std::vector<std::string> out;
  pick_units(module, "", max_params, out);
  return out;
}

FullyShardedDataParallel::FullyShardedDataParallel(Comm& comm, torch::nn::Module& module, FsdpOptions options)
    : ShardedDataParallel(comm, module, options.ddp, "FullyShardedDataParallel", /*own_rows=*/true),
      prefetch_(options.prefetch) {
  const std::string problem = resolve_units(options);
  std::string line = std::string("shard=parameters prefetch=") + (prefetch_ ? "on" : "off");
  for (const auto& u : unit_names_) line += " unit=" + u;
  for (size_t i : units_.back().params) line += " root=" + param_names_[i];
  check_same_model(problem, line);
  build();
}

std::string FullyShardedDataParallel::resolve_units(const FsdpOptions& options) {
  unit_names_ = options.units;
  if (unit_names_.empty())
    for (const auto& child : module_->named_children())
      if (!child.value()->parameters(/*recurse=*/true).empty()) unit_names_.push_back(child.key());
  units_.clear();
  units_.resize(unit_names_.size() + 1);
  param_unit_.assign(params_.size(), root());
  param_nbytes_.assign(params_.size(), 0);
  const auto modules = module_->named_modules("", /*include_self=*/false);
  for (const auto& u : unit_names_) {
    if (!modules.contains(u)) return "FullyShardedDataParallel: unit '" + u + "' is not a submodule of the model";
    for (const auto& v : unit_names_)
      if (under(v, u))
        return "FullyShardedDataParallel: unit '" + v + "' is inside unit '" + u + "' (units do not nest)";
  }
  const auto unit_of = [&](const std::string& name) {
    for (size_t u = 0; u < unit_names_.size(); ++u)
      if (under(name, unit_names_[u])) return u;
    return root();
  };
  std::vector<const void*> storages;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i];
    std::vector<std::string> names = param_aliases_[i];
    names.insert(names.begin(), param_names_[i]);
    // Every name in one unit, and none read outside it: that unit's. Otherwise the root's (tied across units).
    size_t u = unit_of(names.front());
    for (const auto& n : names)
      if (unit_of(n) != u ||
          std::find(options.root_parameters.begin(), options.root_parameters.end(), n) != options.root_parameters.end())
        u = root();
    param_unit_[i] = u;
    units_[u].params.push_back(i);
    const void* storage = p.storage().unsafeGetStorageImpl();
    if (p.storage_offset() != 0 || p.storage().nbytes() != p.nbytes() || !p.is_contiguous() ||
        std::find(storages.begin(), storages.end(), storage) != storages.end())
      return "FullyShardedDataParallel frees each parameter's storage between uses, so each must own its storage "
             "whole; '" +
             param_names_[i] + "' is a view of, or shares, another tensor's";
    storages.push_back(storage);
    param_nbytes_[i] = p.nbytes();
  }
  return "";
}

std::vector<std::string> FullyShardedDataParallel::root_parameter_names() const {
  std::vector<std::string> out;
  for (size_t i : units_.back().params) out.push_back(param_names_[i]);
  return out;
}

std::vector<BucketSpec> FullyShardedDataParallel::layout(const std::vector<size_t>& nbytes,
                                                         const std::vector<int>& /*group*/) const {
  // A bucket per parameter (backward order), so a unit's gradients leave as soon as they are ready, each reduced in
  // autograd's own tensor (adopt_gradient), and a unit is gathered straight into its parameters.
  std::vector<BucketSpec> out;
  for (size_t i = params_.size(); i-- > 0;) out.push_back(BucketSpec{{i}, nbytes[i]});
  return out;
}

size_t FullyShardedDataParallel::unit_index(const std::string& unit) const {
  auto it = std::find(unit_names_.begin(), unit_names_.end(), unit);
  if (it == unit_names_.end()) throw ConfigError("FullyShardedDataParallel: '" + unit + "' is not a unit of the model");
  return static_cast<size_t>(it - unit_names_.begin());
}

torch::Tensor FullyShardedDataParallel::run_unit(const std::string& unit,
                                                 const std::function<torch::Tensor()>& forward) {
  const size_t u = unit_index(unit);
  enter_unit(u);
  torch::Tensor out;
  try {
    out = forward();
  } catch (...) {
    release_unit(u);
    throw;
  }
  exit_unit(u, out);
  return out;
}

torch::Tensor FullyShardedDataParallel::run_forward(const std::function<torch::Tensor()>& forward) {
  begin_forward();
  torch::Tensor out;
  try {
    out = forward();
  } catch (const c10::Error& e) {
    // LibTorch's typed data access refuses a tensor whose storage is empty: a unit's weights read outside run_unit.
    std::string skipped;
    for (size_t u = 0; u < unit_names_.size(); ++u)
      if (!units_[u].params.empty() &&
          std::none_of(entries_.begin(), entries_.end(), [u](const Entry& en) { return en.unit == u; }))
        skipped += (skipped.empty() ? "'" : ", '") + unit_names_[u] + "'";
    end_forward(torch::Tensor());
    const std::string what = e.what_without_backtrace();
    const bool empty_storage = what.find("data is not allocated yet") != std::string::npos ||
                               what.find("storage of size 0") != std::string::npos;
    if (!empty_storage || skipped.empty()) throw;
    throw ConfigError(
        "FullyShardedDataParallel: the model's forward read the weights of a unit it did not run "
        "through run_unit (their storage is empty between uses; LibTorch has no forward hooks, so a C++ "
        "model runs each unit as fsdp.run_unit(name, lambda)); units not run in this forward: " +
        skipped);
  } catch (...) {
    end_forward(torch::Tensor());
    throw;
  }
  end_forward(out);
  return out;
}

void FullyShardedDataParallel::begin_forward() {
  // A prefetch left by a forward whose backward never ran: freed (gather_unit frees any prefetch but the root's).
  gather_unit(root());
  in_forward_ = true;
  predicting_ = order_known_;
  entries_.clear();
  if (!order_known_) order_.clear();
}

void FullyShardedDataParallel::enter_unit(size_t unit) {
  H5DDP_CHECK(unit < unit_names_.size(), "FullyShardedDataParallel: no unit " + std::to_string(unit));
  if (!in_forward_) {  // outside begin_forward/end_forward: no order to follow
    gather_unit(unit);
    return;
  }
  const size_t position = entries_.size();
  if (!order_known_)
    order_.push_back(unit);
  else if (predicting_ && (position >= order_.size() || order_[position] != unit))
    predicting_ = false;  // not the recorded order: no more predictions in this forward (gather_unit frees a wrong one)
  gather_unit(unit);
  entries_.push_back(Entry{unit, false});
  if (prefetch_ && predicting_ && position + 1 < order_.size()) prefetch_unit(order_[position + 1]);
}

void FullyShardedDataParallel::exit_unit(size_t unit, const torch::Tensor& out) {
  // Autograd reaches the hook with the output's gradient, before the unit's own backward: gather it again then, and
  // start the gather of the unit that ran before this one (the next one the backward needs, when that one's output
  // is hooked too). Both follow this forward's order of enter_unit calls, which every rank shares.
  if (out.defined() && out.requires_grad()) {
    size_t next = SIZE_MAX;
    const bool current = in_forward_ && !entries_.empty() && entries_.back().unit == unit;
    if (current) {
      entries_.back().hooked = true;
      if (prefetch_ && entries_.size() >= 2 && entries_[entries_.size() - 2].hooked)
        next = entries_[entries_.size() - 2].unit;
    }
    const_cast<torch::Tensor&>(out).register_hook(
        [this, unit, next](const torch::Tensor&) { regather_unit(unit, next); });
  }
  release_unit(unit);
}

void FullyShardedDataParallel::end_forward(const torch::Tensor& out) {
  const bool was_in_forward = in_forward_;
  in_forward_ = false;
  predicting_ = false;
  if (!out.defined()) {  // the forward threw: nothing stays gathered (or in flight); the order is not kept
    if (!order_known_) order_.clear();
    std::exception_ptr error;
    for (size_t u = 0; u < units_.size(); ++u) {
      try {
        release_unit(u);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
  if (was_in_forward) order_known_ = true;
  // A unit started ahead that this forward did not enter (it ended before the recorded order did): freed.
  if (prefetched_unit_ != SIZE_MAX) release_unit(prefetched_unit_);
  const bool backward = torch::GradMode::is_enabled() && out.requires_grad();
  // With a backward to come the root stays until its gradients are accumulated (gradient_done) or the step ends.
  if (!backward) {
    release_unit(root());
    return;
  }
  // The backward starts with the last unit entered: its gather runs while the loss is computed.
  if (prefetch_ && was_in_forward && !entries_.empty() && entries_.back().hooked) prefetch_unit(entries_.back().unit);
}

std::vector<torch::Tensor> FullyShardedDataParallel::full_parameters() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out(params_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const bool was = units_[u].gathered;
    gather_unit(u);
    for (size_t i : units_[u].params) out[i] = params_[i].detach().clone();
    if (!was) release_unit(u);
  }
  return out;
}

void FullyShardedDataParallel::gather_parameters() {
  H5DDP_CHECK(!armed_ || next_launch_ == 0, "FullyShardedDataParallel: a step while gradient buckets are in flight");
  for (auto& st : bucket_state_) st->shard_grad.zero_();  // the next forward gathers the stepped rows
}

void FullyShardedDataParallel::regather_unit(size_t u, size_t next) {
  gather_unit(u);
  {
    // The gradients of the units after this one were launched while this gather ran; keeping only this rank's
    // range of them now, before this unit's backward allocates its own, holds one unit's gradients at a time.
    std::lock_guard<std::mutex> lock(mutex_);
    if (armed_ && !no_sync_)
      for (size_t b = 0; b < next_launch_; ++b) release_bucket(b);
  }
  if (next != SIZE_MAX) prefetch_unit(next);
}

void FullyShardedDataParallel::prefetch_unit(size_t u) {
  Unit& unit = units_[u];
  if (unit.gathered) return;  // still (or already) there: e.g. the same unit twice in a row
  // At most one unit ahead: one whose prediction was not claimed is freed first.
  if (prefetched_unit_ != SIZE_MAX) release_unit(prefetched_unit_);
  const auto t0 = Clock::now();
  torch::NoGradGuard no_grad;
  unit.gathered = true;  // from here on release_unit waits for what was started
  unit.grads_left = unit.params.size();
  prefetched_unit_ = u;
  for (size_t i : unit.params) {
    const torch::Tensor& p = params_[i];
    allocate_storage(p, param_nbytes_[i]);
    if (param_piece_[i] != SIZE_MAX) {  // this rank's rows first, as gather_unit
      const OwnedPiece& piece = pieces_[param_piece_[i]];
      alias(p, piece.row_begin * row_numel(p), piece.tensor.sizes()).copy_(piece.tensor);
    }
    Bucket& st = *bucket_state_[param_[i].bucket];
    if (st.comm->size() > 1)
      unit.works.push_back(st.comm->allgatherv_async(p.data_ptr(), st.counts, to_dtype(p.scalar_type())));
  }
  ++stats_.unit_gathers;
  ++stats_.prefetched;
  stats_.gather_seconds += seconds_since(t0);
}

void FullyShardedDataParallel::gather_unit(size_t u) {
  // A prefetch of another unit was mispredicted: never left gathered unused (nor in flight).
  if (prefetched_unit_ != SIZE_MAX && prefetched_unit_ != u) release_unit(prefetched_unit_);
  Unit& unit = units_[u];
  if (unit.gathered) {
    if (prefetched_unit_ == u) {  // started ahead: waiting for it is this gather's cost
      const auto t0 = Clock::now();
      prefetched_unit_ = SIZE_MAX;
      for (auto& w : unit.works) w->wait();
      unit.works.clear();
      stats_.gather_seconds += seconds_since(t0);
    }
    return;
  }
  const auto t0 = Clock::now();
  torch::NoGradGuard no_grad;
  for (size_t i : unit.params) {
    const torch::Tensor& p = params_[i];
    allocate_storage(p, param_nbytes_[i]);
    if (param_piece_[i] != SIZE_MAX) {  // this rank's rows first, through an alias (the parameter's version stays)
      const OwnedPiece& piece = pieces_[param_piece_[i]];
      alias(p, piece.row_begin * row_numel(p), piece.tensor.sizes()).copy_(piece.tensor);
    }
    Bucket& st = *bucket_state_[param_[i].bucket];
    if (st.comm->size() > 1) st.comm->allgatherv(p.data_ptr(), st.counts, to_dtype(p.scalar_type()));
  }
  unit.gathered = true;
  unit.grads_left = unit.params.size();
  ++stats_.unit_gathers;
  stats_.gather_seconds += seconds_since(t0);
}

void FullyShardedDataParallel::release_unit(size_t u) {
  Unit& unit = units_[u];
  if (prefetched_unit_ == u) prefetched_unit_ = SIZE_MAX;
  if (!unit.gathered) return;
  // Never free memory a gather in flight writes into: wait for every one (all, even after an error), then free.
  std::exception_ptr error;
  for (auto& w : unit.works) {
    try {
      w->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  unit.works.clear();
  for (size_t i : unit.params) free_storage(params_[i]);
  unit.gathered = false;
  if (error) std::rethrow_exception(error);
}

void FullyShardedDataParallel::gradient_done(size_t index) {
  Unit& unit = units_[param_unit_[index]];
  if (unit.grads_left > 0 && --unit.grads_left == 0) release_unit(param_unit_[index]);
}

double FullyShardedDataParallel::reductions_done(size_t unused_here) {
  // A unit some gradient never reached, or a prefetch no backward claimed: waited for and freed, nothing in flight.
  for (size_t u = 0; u < units_.size(); ++u) release_unit(u);
  return ShardedDataParallel::reductions_done(unused_here);
}

}  // namespace h5ddp

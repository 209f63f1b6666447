#include "h5ddp/torch_state.hpp"

#include <ATen/Context.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "h5ddp/ddp.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/splitmix.hpp"

namespace h5ddp {

DType to_dtype(torch::ScalarType t) {
  if (auto d = dtype_of(t)) return *d;
  throw CheckpointError(std::string("tensor dtype ") + c10::toString(t) + " cannot be checkpointed");
}

torch::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::kF32:
      return torch::kFloat;
    case DType::kF64:
      return torch::kDouble;
    case DType::kF16:
      return torch::kHalf;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kI64:
      return torch::kLong;
    case DType::kI32:
      return torch::kInt;
    case DType::kI16:
      return torch::kShort;
    case DType::kI8:
      return torch::kChar;
    case DType::kU8:
      return torch::kByte;
    case DType::kBool:
      return torch::kBool;
    case DType::kU64:
      break;
  }
  throw CheckpointError(std::string("dtype ") + dtype_name(t) + " has no LibTorch equivalent");
}

namespace {

// Optimizer state keys of each optimizer type, in a fixed order (PyTorch's names).
const std::vector<std::string>& tensor_state_keys(const std::string& type) {
  static const std::vector<std::string> adam = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  static const std::vector<std::string> sgd = {"momentum_buffer"};
  return type == "sgd" ? sgd : adam;
}

// LibTorch keys optimizer state by the parameter's TensorImpl address: as a string of it up to 2.1 (what
// c10::guts::to_string made of the pointer), as the pointer itself since (pytorch#108480, which also removed
// c10::guts::to_string). The key type is read off Optimizer::state(), so both compile (issue 43's audit).
using OptStateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

template <class Key>
Key make_state_key(c10::TensorImpl* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << static_cast<const void*>(impl);
    return s.str();
  } else {
    return impl;
  }
}

OptStateKey state_key(const torch::Tensor& p) {
  return make_state_key<OptStateKey>(p.unsafeGetTensorImpl());
}

torch::Tensor* adam_tensor(torch::optim::OptimizerParamState& s, const std::string& type, const std::string& key) {
  // AdamW's state has the same fields as Adam's but is a distinct class.
  if (type == "adam") {
    auto& a = static_cast<torch::optim::AdamParamState&>(s);
    if (key == "exp_avg") return &a.exp_avg();
    if (key == "exp_avg_sq") return &a.exp_avg_sq();
    if (key == "max_exp_avg_sq") return &a.max_exp_avg_sq();
  } else {
    auto& a = static_cast<torch::optim::AdamWParamState&>(s);
    if (key == "exp_avg") return &a.exp_avg();
    if (key == "exp_avg_sq") return &a.exp_avg_sq();
    if (key == "max_exp_avg_sq") return &a.max_exp_avg_sq();
  }
  return nullptr;
}

// The tensors of the param groups with amsgrad on (Adam, AdamW), in one pass over the groups.
std::set<const c10::TensorImpl*> amsgrad_tensors(torch::optim::Optimizer& opt, const std::string& type) {
  std::set<const c10::TensorImpl*> out;
  for (auto& g : opt.param_groups()) {
    const bool on = type == "adam"    ? static_cast<torch::optim::AdamOptions&>(g.options()).amsgrad()
                    : type == "adamw" ? static_cast<torch::optim::AdamWOptions&>(g.options()).amsgrad()
                                      : false;
    if (on)
      for (const auto& q : g.params()) out.insert(q.unsafeGetTensorImpl());
  }
  return out;
}

// The entries to import plus, for each parameter of an amsgrad group whose file state lacks max_exp_avg_sq, that
// entry: its destination then finds nothing in the file, and load_checkpoint reports the file as another model
// (docs/FORMAT.md: the C++ loader keeps its optimizer's hyperparameters, so an amsgrad difference is one).
std::vector<TensorRef> with_amsgrad_entries(const std::vector<TensorRef>& entries,
                                            const std::function<bool(const std::string&)>& amsgrad) {
  std::vector<TensorRef> out = entries;
  std::set<std::string> has;
  for (const auto& e : entries) has.insert(e.name);
  for (const auto& e : entries) {
    const auto slash = e.name.rfind('/');
    if (slash == std::string::npos || e.name.compare(slash + 1, std::string::npos, "exp_avg") != 0) continue;
    const std::string pname = e.name.substr(0, slash);
    if (amsgrad(pname) && !has.count(pname + "/max_exp_avg_sq"))
      out.push_back(TensorRef{pname + "/max_exp_avg_sq", e.dtype, e.shape, nullptr});
  }
  return out;
}

std::unique_ptr<torch::optim::OptimizerParamState> fresh_param_state(const std::string& type) {
  if (type == "sgd") return std::make_unique<torch::optim::SGDParamState>();
  if (type == "adam") return std::make_unique<torch::optim::AdamParamState>();
  return std::make_unique<torch::optim::AdamWParamState>();
}

}  // namespace

TorchStateBinding::TorchStateBinding(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                     std::string optimizer_type, bool sharded, std::vector<ParamPiece> pieces,
                                     bool model_sharded)
    : model_(model),
      optimizer_(optimizer),
      type_(std::move(optimizer_type)),
      sharded_(sharded),
      model_sharded_(model_sharded) {
  if (type_ != "adam" && type_ != "adamw" && type_ != "sgd")
    throw ConfigError("unknown optimizer type '" + type_ + "'");
  for (auto& item : model_.named_parameters(true)) params_.emplace_back(item.key(), item.value());
  for (auto& item : model_.named_buffers(true)) buffers_.emplace_back(item.key(), item.value());
  std::vector<std::pair<size_t, Held>> held;  // (model position, what the optimizer holds)
  for (const auto& g : optimizer_.param_groups())
    for (const auto& p : g.params()) {
      for (const auto& h : held)
        if (h.second.key.is_same(p))
          throw ConfigError("the optimizer holds '" + h.second.name +
                            "' twice: a tied weight (one tensor under two names) listed once per name by LibTorch's "
                            "parameters(); build the optimizer over h5ddp::unique_parameters(model)");
      size_t position = 0;
      while (position < params_.size() && !params_[position].second.is_same(p)) ++position;
      if (position < params_.size()) {
        held.emplace_back(position, Held{params_[position].first, p});
        continue;
      }
      auto piece = std::find_if(pieces.begin(), pieces.end(), [&](const ParamPiece& q) { return q.tensor.is_same(p); });
      if (piece == pieces.end())
        throw CheckpointError("the optimizer holds a tensor that is not a parameter of the model");
      position = 0;
      while (position < params_.size() && params_[position].first != piece->name) ++position;
      if (position == params_.size())
        throw CheckpointError("the optimizer holds a piece of '" + piece->name + "', which the model does not have");
      const int64_t rows = params_[position].second.dim() == 0 ? 1 : params_[position].second.size(0);
      const bool whole = piece->row_begin == 0 && piece->row_end == rows;
      held.emplace_back(position, Held{piece->name, p, whole ? 0 : piece->row_begin, whole ? -1 : piece->row_end});
    }
  std::stable_sort(held.begin(), held.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& entry : held) held_.push_back(std::move(entry.second));
}

const TorchStateBinding::Held& TorchStateBinding::held_of(const torch::Tensor& p) const {
  for (const auto& h : held_)
    if (h.key.is_same(p)) return h;
  throw CheckpointError("the optimizer holds a tensor that is not a parameter of the model");
}

const TorchStateBinding::Held* TorchStateBinding::held_named(const std::string& name) const {
  for (const auto& h : held_)
    if (h.name == name) return &h;
  return nullptr;
}

TensorRef TorchStateBinding::held_view(const Held& h, const std::string& name, torch::Tensor t) {
  TensorRef r = view(name, std::move(t));
  if (h.row_end < 0) return r;
  for (const auto& [n, p] : params_)
    if (n == h.name) r.shape = p.sizes().vec();  // the parameter's shape, of which `t` holds some rows
  r.row_begin = h.row_begin;
  r.row_end = h.row_end;
  return r;
}

TensorRef TorchStateBinding::model_view(const std::string& name, const torch::Tensor& p) {
  if (!model_sharded_ || !p.requires_grad()) return view(name, p);
  // A tied weight's other names are written from the rows held under its first name (the pieces' name).
  std::string first = name;
  for (const auto& [n, t] : params_)
    if (t.is_same(p)) {
      first = n;
      break;
    }
  const Held* h = held_named(first);
  if (h == nullptr) {  // another rank's rows: listed with none here, so every rank lists every parameter
    TensorRef r{name, to_dtype(p.scalar_type()), p.sizes().vec(), nullptr};
    r.row_begin = r.row_end = 0;
    return r;
  }
  TensorRef r = view(name, h->key);
  r.shape = p.sizes().vec();
  r.row_begin = h->row_end < 0 ? 0 : h->row_begin;
  r.row_end = h->row_end < 0 ? r.rows() : h->row_end;
  return r;
}

std::vector<std::string> TorchStateBinding::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : params_) out.push_back(n);
  for (const auto& [n, t] : buffers_) out.push_back(n);
  return out;
}

TensorRef TorchStateBinding::view(const std::string& name, torch::Tensor t) {
  TensorRef r;
  r.name = name;
  r.dtype = to_dtype(t.scalar_type());
  r.shape = t.sizes().vec();
  if (t.device().is_cpu() && t.is_contiguous()) {
    r.data = t.data_ptr();
  } else if (t.is_cuda()) {
    // A GPU tensor goes through pinned host memory: the copy runs at the bus's speed, and a load's copy back
    // lands on the tensor's own device (each rank's GPU), never on GPU 0.
    Staged s{t, torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true))};
    s.host.copy_(t.detach());
    r.data = s.host.data_ptr();
    staged_.push_back(std::move(s));
  } else {
    Staged s{t, t.detach().to(torch::kCPU).contiguous().clone()};
    r.data = s.host.data_ptr();
    staged_.push_back(std::move(s));
  }
  return r;
}

void TorchStateBinding::export_optimizer(OptimizerState& out) {
  out.type = type_;
  out.sharded = sharded_;
  out.groups.clear();
  out.state.clear();
  steps_.clear();
  step_params_.clear();
  for (auto& g : optimizer_.param_groups()) {
    ParamGroup pg;
    if (type_ == "sgd") {
      auto& o = static_cast<torch::optim::SGDOptions&>(g.options());
      pg.hyper = {{"lr", o.lr()},
                  {"momentum", o.momentum()},
                  {"dampening", o.dampening()},
                  {"weight_decay", o.weight_decay()},
                  {"nesterov", o.nesterov() ? 1.0 : 0.0}};
    } else if (type_ == "adam") {
      auto& o = static_cast<torch::optim::AdamOptions&>(g.options());
      pg.hyper = {{"lr", o.lr()},   {"betas0", std::get<0>(o.betas())}, {"betas1", std::get<1>(o.betas())},
                  {"eps", o.eps()}, {"weight_decay", o.weight_decay()}, {"amsgrad", o.amsgrad() ? 1.0 : 0.0}};
    } else {
      auto& o = static_cast<torch::optim::AdamWOptions&>(g.options());
      pg.hyper = {{"lr", o.lr()},   {"betas0", std::get<0>(o.betas())}, {"betas1", std::get<1>(o.betas())},
                  {"eps", o.eps()}, {"weight_decay", o.weight_decay()}, {"amsgrad", o.amsgrad() ? 1.0 : 0.0}};
    }
    for (const auto& p : g.params()) pg.params.push_back(held_of(p).name);
    out.groups.push_back(std::move(pg));
  }
  // Reserve first: TensorRefs point into steps_, which must not reallocate.
  steps_.reserve(held_.size());
  for (const Held& h : held_) {
    const std::string& name = h.name;
    auto it = optimizer_.state().find(state_key(h.key));
    if (it == optimizer_.state().end()) continue;  // no state yet (e.g. before the first step)
    auto& s = *it->second;
    if (type_ == "sgd") {
      auto& buf = static_cast<torch::optim::SGDParamState&>(s).momentum_buffer();
      if (buf.defined()) out.state.push_back(held_view(h, name + "/momentum_buffer", buf));
      continue;
    }
    for (const auto& key : tensor_state_keys(type_)) {
      torch::Tensor* t = adam_tensor(s, type_, key);
      if (t && t->defined()) out.state.push_back(held_view(h, name + "/" + key, *t));
    }
    steps_.push_back(type_ == "adam" ? static_cast<torch::optim::AdamParamState&>(s).step()
                                     : static_cast<torch::optim::AdamWParamState&>(s).step());
    step_params_.push_back(name);
    out.state.push_back(TensorRef{name + "/step", DType::kI64, {}, &steps_.back()});
  }
}

void TorchStateBinding::export_state(TrainState& state) {
  staged_.clear();
  state.model.clear();
  for (const auto& [n, t] : params_) state.model.push_back(model_view(n, t));
  for (const auto& [n, t] : buffers_) state.model.push_back(view(n, t));
  export_optimizer(state.optimizer);
  state.rng = capture_rng();
}

void TorchStateBinding::prepare_import(const std::vector<TensorRef>& entries, TrainState& state) {
  staged_.clear();
  steps_.clear();
  step_params_.clear();
  state.model.clear();
  for (const auto& [n, t] : params_) state.model.push_back(model_view(n, t));
  for (const auto& [n, t] : buffers_) state.model.push_back(view(n, t));

  // Fresh optimizer state for exactly the parameters the checkpoint has state for.
  optimizer_.state().clear();
  state.optimizer.state.clear();
  state.optimizer.type = type_;
  state.optimizer.sharded = sharded_;
  const std::set<const c10::TensorImpl*> amsgrad_on = amsgrad_tensors(optimizer_, type_);
  auto amsgrad = [&](const std::string& p) {
    const Held* h = held_named(p);
    return h && amsgrad_on.count(h->key.unsafeGetTensorImpl()) > 0;
  };
  const std::vector<TensorRef> all = with_amsgrad_entries(entries, amsgrad);
  steps_.reserve(all.size());
  // An entry that fits no parameter or no state of this optimizer (max_exp_avg_sq without amsgrad) gets no
  // destination: load_checkpoint lists it with every other difference between the file and the model.
  for (const auto& e : all) {
    const auto slash = e.name.rfind('/');
    if (slash == std::string::npos) throw CheckpointError("optimizer state entry '" + e.name + "' has no '/<key>'");
    const std::string pname = e.name.substr(0, slash), key = e.name.substr(slash + 1);
    const Held* h = held_named(pname);
    const torch::Tensor* param = h ? &h->key : nullptr;
    if (!h && !sharded_)  // a parameter this optimizer does not hold: a destination all the same
      for (const auto& [n, t] : params_)
        if (n == pname) param = &t;
    // Sharded: another rank's parameter (load_checkpoint checks that some rank takes every entry).
    if (!param || (key == "step" && type_ == "sgd") || (h && key == "max_exp_avg_sq" && !amsgrad(pname))) continue;

    auto& slot = optimizer_.state()[state_key(*param)];
    if (!slot) slot = fresh_param_state(type_);
    if (key == "step") {  // a step of another dtype or shape shows up in load_checkpoint's list
      steps_.push_back(0);
      step_params_.push_back(pname);
      state.optimizer.state.push_back(TensorRef{e.name, DType::kI64, {}, &steps_.back()});
      continue;
    }
    torch::Tensor* dst = nullptr;
    if (type_ == "sgd" && key == "momentum_buffer")
      dst = &static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer();
    else if (type_ != "sgd")
      dst = adam_tensor(*slot, type_, key);
    if (!dst) continue;
    // The destination has the parameter's shape (what this model needs); a file entry of another shape is a
    // difference load_checkpoint reports.
    *dst = torch::zeros(param->sizes(), param->options().dtype(to_scalar_type(e.dtype)));
    state.optimizer.state.push_back(h ? held_view(*h, e.name, *dst) : view(e.name, *dst));
  }
  // Parameters whose state the checkpoint lacks must not keep a half-built state.
  for (const Held& h : held_) {
    auto it = optimizer_.state().find(state_key(h.key));
    if (it != optimizer_.state().end() && type_ == "sgd" &&
        !static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().defined())
      optimizer_.state().erase(it);
  }
}

void TorchStateBinding::finish_import() {
  torch::NoGradGuard no_grad;
  for (auto& s : staged_) s.target.copy_(s.host);
  staged_.clear();
  for (size_t i = 0; i < step_params_.size(); ++i) {
    const Held* h = held_named(step_params_[i]);
    const torch::Tensor* param = h ? &h->key : nullptr;
    if (!param)
      for (const auto& [n, t] : params_)
        if (n == step_params_[i]) param = &t;
    auto& s = *optimizer_.state().at(state_key(*param));
    if (type_ == "adam")
      static_cast<torch::optim::AdamParamState&>(s).step(steps_[i]);
    else
      static_cast<torch::optim::AdamWParamState&>(s).step(steps_[i]);
  }
  // An Adam state without exp_avg would crash LibTorch's step: the checkpoint must be complete.
  std::vector<std::pair<std::string, torch::Tensor>> keyed = params_;  // a piece's state is keyed by the piece
  for (const Held& h : held_) keyed.emplace_back(h.name, h.key);
  if (type_ != "sgd")
    for (const auto& [n, p] : keyed) {
      auto it = optimizer_.state().find(state_key(p));
      if (it == optimizer_.state().end()) continue;
      if (!adam_tensor(*it->second, type_, "exp_avg")->defined() ||
          !adam_tensor(*it->second, type_, "exp_avg_sq")->defined())
        throw CheckpointError("optimizer state of " + n + " is incomplete (exp_avg and exp_avg_sq are required)");
    }
}

RngState capture_rng() {
  RngState r;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    torch::Tensor s = gen.get_state();
    r.cpu.assign(s.data_ptr<uint8_t>(), s.data_ptr<uint8_t>() + s.numel());
  }
  if (torch::cuda::is_available()) {
    auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA));
    std::lock_guard<std::mutex> lock(gen.mutex());
    torch::Tensor s = gen.get_state();
    r.cuda.assign(s.data_ptr<uint8_t>(), s.data_ptr<uint8_t>() + s.numel());
  }
  return r;
}

namespace {
void set_generator(at::Generator gen, const std::vector<uint8_t>& bytes) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(t);
}
}  // namespace

void restore_rng(const RngState& rng) {
  if (!rng.cpu.empty()) set_generator(at::detail::getDefaultCPUGenerator(), rng.cpu);
  if (!rng.cuda.empty() && torch::cuda::is_available())
    set_generator(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA)), rng.cuda);
}

void seed_rank_rng(uint64_t seed, int rank) {
  torch::manual_seed(seed + static_cast<uint64_t>(rank));
}

bool restore_rank_rng(const std::vector<RngState>& rows, int rank, uint64_t seed, int64_t step) {
  if (rank < static_cast<int>(rows.size()) && !rows[rank].cpu.empty()) {
    restore_rng(rows[rank]);
    return true;
  }
  torch::manual_seed(mix_seed(mix_seed(seed, static_cast<uint64_t>(rank)), static_cast<uint64_t>(step)));
  return false;
}

}  // namespace h5ddp

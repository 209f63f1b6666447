#include "h5ddp/checkpointer.hpp"

#include <torch/version.h>

#include <algorithm>
#include <csignal>
#include <filesystem>

#include "checkpoint/async_checkpoint.hpp"
#include "h5ddp/clock.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/policy.hpp"
#include "h5ddp/sharded_optimizer.hpp"
#include "h5ddp/stop_signal.hpp"
#include "h5ddp/torch_state.hpp"

namespace h5ddp {
namespace {

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// An optimizer of `type` with default hyperparameters over `params`: the destination of a file's optimizer
// state when only its weights are wanted (load_weights from a file of another optimizer).
std::unique_ptr<torch::optim::Optimizer> scratch_optimizer(const std::string& type,
                                                           const std::vector<torch::Tensor>& params) {
  if (type == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  if (type == "adamw") return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions());
  if (type == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions());
  throw ConfigError("unknown optimizer type '" + type + "'");
}

}  // namespace

std::string optimizer_type_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "sgd";
  throw ConfigError(
      "h5ddp checkpoints the state of torch::optim::Adam, AdamW and SGD; this optimizer is another class");
}

// One tracked value of the caller: a tensor (viewed in place when it is a contiguous CPU tensor, staged
// through a host copy otherwise) or a scalar variable.
struct Tracked {
  std::string name;
  torch::Tensor tensor;
  int64_t* i64 = nullptr;
  double* f64 = nullptr;
  torch::Tensor host;  // staging copy for a device or non-contiguous tensor

  TensorRef ref() {
    if (i64) return TensorRef{name, DType::kI64, {}, i64};
    if (f64) return TensorRef{name, DType::kF64, {}, f64};
    torch::Tensor t = tensor;
    if (!(t.device().is_cpu() && t.is_contiguous())) {
      host = t.detach().to(torch::kCPU).contiguous().clone();
      t = host;
    }
    return TensorRef{name, to_dtype(t.scalar_type()), t.sizes().vec(), t.data_ptr()};
  }
  void finish_import() {
    if (!host.defined()) return;
    torch::NoGradGuard no_grad;
    tensor.copy_(host);
    host = torch::Tensor();
  }
};

// What a failed load may have overwritten, as it was before: weights, optimizer state, tracked values.
struct Snapshot {
  std::vector<torch::Tensor> tensors;  // model parameters, buffers, tracked tensors (clones, in order)
  std::vector<int64_t> i64;
  std::vector<double> f64;
  // Shallow clones (sharing tensors): a load never writes into existing optimizer state, it allocates anew.
  std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())> optimizer_state;
};

struct Checkpointer::Impl {
  Impl(torch::nn::Module& m, torch::optim::Optimizer& o, bool sharded, std::vector<ParamPiece> pieces_in,
       bool model_sharded_in)
      : model(m),
        optimizer(o),
        type(optimizer_type_of(o)),
        binding(m, o, type, sharded, pieces_in, model_sharded_in),
        pieces(std::move(pieces_in)),
        model_sharded(model_sharded_in) {}

  torch::nn::Module& model;
  torch::optim::Optimizer& optimizer;
  std::string type;
  TorchStateBinding binding;
  std::vector<ParamPiece> pieces;
  bool model_sharded = false;  // shard stage 3: the trainable parameters are the pieces (their storage is empty)
  std::vector<Tracked> tracked;
  std::map<std::string, std::string> meta;
  std::string shard = "none";  // /meta shard: how the optimizer state was split when the file was written
  std::function<SchedulerState(int64_t)> scheduler;
  std::unique_ptr<AsyncCheckpointer> async;
  bool signals = false;
  Clock::time_point last_save_time = Clock::now();
  int64_t no_save = -1;  // last_saved_step when no save of this process has been committed
  SaveResult last_result;

  std::vector<torch::Tensor> model_tensors() {
    std::vector<torch::Tensor> out;
    for (auto& p : model.parameters(true))
      if (!model_sharded || !p.requires_grad()) out.push_back(p);
    for (auto& piece : pieces)
      if (model_sharded) out.push_back(piece.tensor);
    for (auto& b : model.buffers(true)) out.push_back(b);
    for (auto& t : tracked)
      if (t.tensor.defined()) out.push_back(t.tensor);
    return out;
  }

  Snapshot take() {
    torch::NoGradGuard no_grad;
    Snapshot s;
    for (auto& t : model_tensors()) s.tensors.push_back(t.detach().clone());
    for (auto& t : tracked) {
      if (t.i64) s.i64.push_back(*t.i64);
      if (t.f64) s.f64.push_back(*t.f64);
    }
    for (auto& [k, v] : optimizer.state()) s.optimizer_state[k] = v->clone();
    return s;
  }

  void put_back(Snapshot& s) {
    torch::NoGradGuard no_grad;
    auto now = model_tensors();
    for (size_t i = 0; i < now.size(); ++i) now[i].copy_(s.tensors[i]);
    size_t i = 0, d = 0;
    for (auto& t : tracked) {
      if (t.i64) *t.i64 = s.i64[i++];
      if (t.f64) *t.f64 = s.f64[d++];
      t.host = torch::Tensor();
    }
    optimizer.state().swap(s.optimizer_state);
  }

  // Where a weights-only load puts what it does not keep: every tensor of the file needs a destination, so the
  // file's optimizer state goes to a scratch optimizer of its type (when it is not this one's) and its user
  // state to scratch tensors. Returns the binding the optimizer state goes through.
  struct Scratch {
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unique_ptr<TorchStateBinding> binding;
    std::vector<torch::Tensor> user;
  };
  TorchStateBinding* scratch_destinations(const CheckpointManifest& manifest, TrainState& st, Scratch& scratch) {
    TorchStateBinding* b = &binding;
    if (!manifest.optimizer_type.empty() && manifest.optimizer_type != type) {
      if (model_sharded) {  // stage 3: a scratch optimizer over the pieces, the model imported as their rows
        std::vector<torch::Tensor> held;
        for (const auto& piece : pieces) held.push_back(piece.tensor);
        scratch.optimizer = scratch_optimizer(manifest.optimizer_type, held);
        scratch.binding = std::make_unique<TorchStateBinding>(model, *scratch.optimizer, manifest.optimizer_type,
                                                              /*sharded=*/true, pieces, /*model_sharded=*/true);
      } else {
        scratch.optimizer = scratch_optimizer(manifest.optimizer_type, model.parameters(true));
        scratch.binding = std::make_unique<TorchStateBinding>(model, *scratch.optimizer, manifest.optimizer_type);
      }
      b = scratch.binding.get();
    }
    for (const auto& t : manifest.user) {
      scratch.user.push_back(torch::empty(t.shape, torch::TensorOptions().dtype(to_scalar_type(t.dtype))));
      st.user.push_back(TensorRef{t.name, t.dtype, t.shape, scratch.user.back().data_ptr()});
    }
    return b;
  }

  // Loads `path` into the model, this optimizer (or a scratch one of the file's type) and the tracked
  // values, in one descent: the file is opened once, and its manifest tells the destinations to allocate
  // (the optimizer state it lists). Throws on every rank alike; the caller restores the snapshot.
  TrainState load(MpiComm& comm, const std::string& path, const LoadOptions& options, bool weights_only) {
    TrainState st;
    Scratch scratch;
    TorchStateBinding* b = &binding;
    bool prepared = false;  // errors from then on name the file being loaded ("while loading <path>")
    auto destinations = [&](const CheckpointManifest& manifest) -> TrainState& {
      // Another optimizer makes it another model's file (docs/FORMAT.md "Loading"): no fallback to older files.
      if (!weights_only && manifest.optimizer_type != type)
        comm.rethrow_first(std::make_exception_ptr(CheckpointMismatchError(
            "checkpoint " + path + " holds optimizer state of type " +
            (manifest.optimizer_type.empty() ? std::string("none (a weights-only file)") : manifest.optimizer_type) +
            "; this run's optimizer is of type " + type)));
      std::vector<TensorRef> entries;
      for (const auto& t : manifest.optimizer_state) entries.push_back(TensorRef{t.name, t.dtype, t.shape, nullptr});
      if (weights_only) b = scratch_destinations(manifest, st, scratch);
      with_context("loading " + path, [&] {
        b->prepare_import(entries, st);
        if (!weights_only)
          for (auto& t : tracked) st.user.push_back(t.ref());
      });
      prepared = true;
      return st;
    };
    try {
      load_checkpoint(comm, path, destinations, options);
      b->finish_import();
      if (!weights_only)
        for (auto& t : tracked) t.finish_import();
    } catch (Error& e) {
      if (prepared) e.add_context("loading " + path);
      throw;
    }
    return st;
  }
};

Checkpointer::Checkpointer(MpiComm& comm, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                           CheckpointerOptions options)
    : Checkpointer(comm, model, optimizer, std::move(options), nullptr) {}

Checkpointer::Checkpointer(MpiComm& comm, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                           CheckpointerOptions options, const ShardedOptimizer* sharded)
    : comm_(comm),
      options_(std::move(options)),
      impl_(std::make_unique<Impl>(model, optimizer, options_.shard_optimizer,
                                   sharded ? sharded->pieces() : std::vector<ParamPiece>{},
                                   sharded && std::string(sharded->wrapper().shard_name()) == "parameters")) {
  if (sharded)
    impl_->shard = sharded->wrapper().shard_name();
  else if (options_.shard_optimizer)
    impl_->shard = "optimizer (whole parameters)";
  std::error_code ec;
  std::filesystem::create_directories(options_.run_dir, ec);
  comm_.raise_if_any(std::filesystem::is_directory(options_.run_dir)
                         ? ""
                         : "cannot create the run directory " + options_.run_dir + (ec ? ": " + ec.message() : ""));
  if (options_.async) impl_->async = std::make_unique<AsyncCheckpointer>(comm_);
  if (options_.handle_signals) {
    stop_signal::install();
    impl_->signals = true;
  }
}

namespace {
CheckpointerOptions sharded(CheckpointerOptions options) {
  options.shard_optimizer = true;
  return options;
}
}  // namespace

Checkpointer::Checkpointer(MpiComm& comm, torch::nn::Module& model, ShardedOptimizer& optimizer,
                           CheckpointerOptions options)
    : Checkpointer(comm, model, optimizer.local(), sharded(std::move(options)), &optimizer) {}

Checkpointer::~Checkpointer() {
  impl_->async.reset();  // waits for a save in flight; logs, never throws
  if (impl_->signals) stop_signal::uninstall();
}

const std::string& Checkpointer::optimizer_type() const {
  return impl_->type;
}

void Checkpointer::track(const std::string& name, torch::Tensor tensor) {
  H5DDP_CHECK(tensor.defined(), "Checkpointer::track(" + name + "): undefined tensor");
  impl_->tracked.push_back(Tracked{name, std::move(tensor), nullptr, nullptr, {}});
}

void Checkpointer::track(const std::string& name, int64_t* value) {
  H5DDP_CHECK(value != nullptr, "Checkpointer::track(" + name + "): null pointer");
  impl_->tracked.push_back(Tracked{name, {}, value, nullptr, {}});
}

void Checkpointer::track(const std::string& name, double* value) {
  H5DDP_CHECK(value != nullptr, "Checkpointer::track(" + name + "): null pointer");
  impl_->tracked.push_back(Tracked{name, {}, nullptr, value, {}});
}

void Checkpointer::set_keep_files(std::vector<std::string> file_names) {
  options_.retention.keep_files = std::move(file_names);
}

void Checkpointer::set_meta(const std::string& key, const std::string& value) {
  impl_->meta[key] = value;
}

void Checkpointer::set_scheduler_state(std::function<SchedulerState(int64_t)> fn) {
  impl_->scheduler = std::move(fn);
}

namespace {
// docs/FORMAT.md "Decisions of revision 2": rows of another generator's state length (another PyTorch, another
// generator) cannot be restored: the file is another model's for this process, refused before anything is kept.
// Every rank judges the same rows (all of them), so the verdict agrees.
void check_rng_rows(const std::vector<RngState>& rows, const std::string& path) {
  const size_t mine = capture_rng().cpu.size();
  for (const auto& row : rows)
    if (!row.cpu.empty() && row.cpu.size() != mine)
      throw CheckpointMismatchError(path + ": " + format::kRngCpu + " rows are " + std::to_string(row.cpu.size()) +
                                    " bytes; this process's CPU generator state is " + std::to_string(mine) +
                                    " bytes (another generator): it cannot be restored");
}
}  // namespace

ResumeInfo Checkpointer::load_resumed(const std::string& path) {
  std::optional<Snapshot> snap;
  TrainState st;
  try {
    snap = impl_->take();
    st = impl_->load(comm_, path, options_.load, false);
    check_rng_rows(st.rng_by_rank, path);
  } catch (CheckpointError& e) {
    if (snap) impl_->put_back(*snap);
    if (e.file().empty()) e.set_file(path);  // the same path on every rank: the error names its file as a field
    throw;
  } catch (...) {
    if (snap) impl_->put_back(*snap);
    throw;
  }
  counters_ = st.counters;
  data_ = st.data;
  ResumeInfo info;
  info.resumed = true;
  info.path = path;
  info.step = counters_.step;
  info.saved_world_size = st.saved_world_size;
  info.meta = st.meta;
  info.scheduler = st.scheduler;
  const bool exact = restore_rank_rng(st.rng_by_rank, comm_.rank(), data_.seed, counters_.step);
  info.rng_exact = comm_.all_ok(exact);
  last_saved_step_ = impl_->no_save = counters_.step;
  last_path_.clear();
  impl_->last_save_time = Clock::now();
  return info;
}

ResumeInfo Checkpointer::resume() {
  ResumeInfo info;
  resume_newest(comm_, options_.run_dir, [&](const std::string& path) { info = load_resumed(path); });
  impl_->last_save_time = Clock::now();
  return info;
}

ResumeInfo Checkpointer::resume_from(const std::string& path) {
  return load_resumed(path);
}

void Checkpointer::load_weights(const std::string& path) {
  Snapshot snap = impl_->take();
  try {
    impl_->load(comm_, path, options_.load, true);
  } catch (...) {
    impl_->put_back(snap);
    throw;
  }
  impl_->optimizer.state().clear();
}

TrainState Checkpointer::export_state() {
  TrainState st;
  impl_->binding.export_state(st);
  for (auto& t : impl_->tracked) st.user.push_back(t.ref());
  st.counters = counters_;
  st.data = data_;
  if (impl_->scheduler)
    st.scheduler = impl_->scheduler(counters_.step);
  else
    st.scheduler.type = "none";
  st.meta = impl_->meta;
  st.meta["torch_version"] = torch_version();
  st.meta["optimizer"] = impl_->type;
  st.meta["shard"] = impl_->shard;
  return st;
}

SaveResult Checkpointer::save() {
  const auto t0 = Clock::now();
  wait();
  TrainState st = export_state();
  SaveOptions o;
  o.fsync = options_.fsync;
  o.retention = options_.retention;
  o.verify_replicas = options_.verify_replicas;
  o.write_mode = options_.write_mode;
  o.mpiio_hints = options_.mpiio_hints;
  o.alignment = options_.alignment;
  impl_->last_save_time = Clock::now();
  stats_ = SaveStats();
  stats_.step = counters_.step;
  stats_.async = impl_->async != nullptr;
  if (impl_->async) {
    impl_->async->start(st, options_.run_dir, o);
    last_saved_step_ = counters_.step;
    stats_.blocked_seconds = seconds_since(t0);
    stats_.seconds = impl_->last_result.seconds;
    for (const auto& t : st.model) stats_.bytes += t.nbytes();
    for (const auto& t : st.optimizer.state) stats_.bytes += t.nbytes();
    for (const auto& t : st.user) stats_.bytes += t.nbytes();
    stats_.path = options_.run_dir + "/" + format::checkpoint_file_name(counters_.step);
    return impl_->last_result;
  }
  impl_->last_result = save_checkpoint(comm_, st, options_.run_dir, o);
  last_saved_step_ = counters_.step;
  last_path_ = impl_->last_result.path;
  stats_.blocked_seconds = stats_.seconds = seconds_since(t0);
  stats_.bytes = impl_->last_result.bytes;
  stats_.path = last_path_;
  log::debug("saved " + last_path_ + " in " + std::to_string(impl_->last_result.seconds) + " s");
  return impl_->last_result;
}

// A failed periodic save with continue_on_save_error is reported (the same error on every rank, the previous
// checkpoint and `latest` untouched) and retried at the next trigger; everything else rethrows.
void Checkpointer::save_guarded(bool final_save) {
  auto report_or_throw = [&](const Error& e) {
    if (final_save || !options_.continue_on_save_error) throw;
    if (comm_.rank() == 0)
      log::warn(
          "checkpoint save failed; training continues and retries at the next trigger; the previous "
          "checkpoint and `latest` are unchanged:\n" +
          std::string(e.what()));
  };
  const int64_t previous = last_saved_step_;
  try {
    wait();
  } catch (const Error& e) {
    report_or_throw(e);
  }
  try {
    save();
    if (final_save) wait();
  } catch (const Error& e) {
    last_saved_step_ = previous;
    report_or_throw(e);
  }
}

SaveResult Checkpointer::wait() {
  if (!impl_->async) return impl_->last_result;
  try {
    const SaveResult r = impl_->async->wait();
    if (!r.path.empty()) {
      impl_->last_result = r;
      last_path_ = r.path;
    }
  } catch (const Error&) {
    last_saved_step_ = impl_->no_save;  // the step in flight is not saved
    throw;
  }
  return impl_->last_result;
}

StepOutcome Checkpointer::agree_step(int64_t step, double value) {
  if (step > counters_.step) counters_.samples_consumed += (step - counters_.step) * data_.global_batch;
  counters_.step = step;
  counters_.epoch = data_.epoch;
  // One allreduce carries everything the ranks must agree on: any rank's signal and time trigger, and the
  // caller's value (its mean, for logging).
  const int sig = impl_->signals ? stop_signal::pending() : 0;
  const SavePolicy policy(options_.every_steps, options_.every_seconds);
  const bool time_due = policy.time_due(seconds_since(impl_->last_save_time));  // due on any rank: due
  double agree[4] = {value, (sig == SIGUSR1 || sig == SIGTERM) ? 1.0 : 0.0, sig == SIGINT ? 1.0 : 0.0,
                     time_due ? 1.0 : 0.0};
  comm_.allreduce(agree, 4, DType::kF64, ReduceOp::kSum);
  StepOutcome out;
  out.value_mean = agree[0] / comm_.size();
  if (agree[1] > 0) exit_code_ = stop_signal::kExitRequeue;
  if (agree[2] > 0) exit_code_ = stop_signal::kExitInterrupted;
  out.stop = exit_code_ != 0;
  out.exit_code = exit_code_;
  try {
    if (impl_->async && impl_->async->in_flight()) impl_->async->poll();  // a failure throws on all ranks
  } catch (const Error& e) {
    last_saved_step_ = impl_->no_save;
    if (!options_.continue_on_save_error) throw;
    if (comm_.rank() == 0)
      log::warn("background checkpoint save failed; training continues and retries at the next trigger:\n" +
                std::string(e.what()));
  }
  // Agreed values only: the same on every rank.
  out.save_due = policy.decide_agreed(step, agree[3] > 0, out.stop).due();
  return out;
}

void Checkpointer::save_if_due(StepOutcome& outcome) {
  if (!outcome.save_due) return;
  save_guarded(outcome.stop);
  outcome.saved = last_saved_step_ == counters_.step;
}

StepOutcome Checkpointer::step_end(int64_t step, double value) {
  StepOutcome out = agree_step(step, value);
  save_if_due(out);
  return out;
}

SaveResult Checkpointer::finish(bool final_save) {
  try {
    wait();
  } catch (const Error& e) {
    if (!options_.continue_on_save_error) throw;
    if (comm_.rank() == 0)
      log::warn("background checkpoint save failed; the final save redoes it:\n" + std::string(e.what()));
  }
  if (final_save && last_saved_step_ != counters_.step) save_guarded(true);
  return impl_->last_result;
}

}  // namespace h5ddp

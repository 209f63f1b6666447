#include "h5ddp/trainer.hpp"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "h5ddp/async_checkpoint.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/data.hpp"
#include "h5ddp/ddp.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/lr_schedule.hpp"
#include "h5ddp/models.hpp"
#include "h5ddp/sampler.hpp"
#include "h5ddp/stop_signal.hpp"
#include "h5ddp/torch_state.hpp"
#include "h5ddp/watchdog.hpp"

namespace h5ddp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& c, const std::vector<torch::Tensor>& p) {
  if (c.optimizer == "sgd")
    return std::make_unique<torch::optim::SGD>(
        p, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  if (c.optimizer == "adamw")
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) g.options().set_lr(lr);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string shell_join(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) {
    const bool plain = !a.empty() && a.find_first_of(" \t\n'\"\\$`;&|<>()*?[]{}~!#") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return out;
}

// The batch of `indices` as tensors: images [B, 1, 28, 28] and labels [B].
std::pair<torch::Tensor, torch::Tensor> gather(const torch::Tensor& images, const torch::Tensor& labels,
                                               const std::vector<int64_t>& indices) {
  auto idx = torch::from_blob(const_cast<int64_t*>(indices.data()), {static_cast<int64_t>(indices.size())},
                              torch::kLong);
  return {images.index_select(0, idx), labels.index_select(0, idx)};
}

// Collective. Fraction of the test set classified correctly; each rank scores a contiguous share.
double evaluate(Model& model, const ImageDataset& test, Comm& comm) {
  torch::NoGradGuard no_grad;
  model.eval();
  const int64_t n = test.count, r = comm.rank(), w = comm.size();
  const int64_t begin = n * r / w, end = n * (r + 1) / w;
  auto images = torch::from_blob(const_cast<float*>(test.images.data()), {n, 1, test.rows, test.cols});
  auto labels = torch::from_blob(const_cast<int64_t*>(test.labels.data()), {n}, torch::kLong);
  int64_t counts[2] = {0, n};
  constexpr int64_t kEvalBatch = 1000;
  for (int64_t b = begin; b < end; b += kEvalBatch) {
    const int64_t e = std::min(end, b + kEvalBatch);
    auto pred = model.forward(images.slice(0, b, e)).argmax(1);
    counts[0] += pred.eq(labels.slice(0, b, e)).sum().item<int64_t>();
  }
  comm.allreduce(&counts[0], 1, DType::kI64, ReduceOp::kSum);
  model.train();
  return static_cast<double>(counts[0]) / static_cast<double>(n);
}

// Rank 0's progress display: '\r'-updated line on a terminal, a line every `every` steps otherwise.
class Progress {
 public:
  Progress(bool enabled, const std::string& mode, int64_t total_steps, int64_t log_every)
      : enabled_(enabled), tty_(enabled && use_tty(mode)), total_(total_steps),
        every_(log_every > 0 ? log_every : std::max<int64_t>(1, total_steps / 20)) {}

  // Open MPI hands its ranks a pseudo-terminal even when mpirun's own output is a pipe or a file, so
  // under mpirun "auto" means lines; --progress tty (e.g. from a launch script that saw a terminal) forces it.
  static bool use_tty(const std::string& mode) {
    if (mode != "auto") return mode == "tty";
    return ::isatty(STDOUT_FILENO) && !std::getenv("OMPI_COMM_WORLD_SIZE");
  }

  void start(int64_t step) {
    start_step_ = step;
    start_ = last_print_ = Clock::now();
  }

  void update(int64_t step, int64_t epoch, int64_t epochs, double loss, int64_t global_batch, bool last) {
    if (!enabled_) return;
    loss_sum_ += loss;
    ++loss_n_;
    const bool due = tty_ ? (seconds_since(last_print_) > 0.25 || last) : (step % every_ == 0 || last);
    if (!due) return;
    const double el = seconds_since(start_);
    const double sps = el > 0 ? static_cast<double>(step - start_step_) / el : 0;
    const double eta = sps > 0 ? static_cast<double>(total_ - step) / sps : NAN;
    std::printf("%sstep %lld/%lld  epoch %lld/%lld  loss %.4f  %.0f samples/s  elapsed %s  ETA %s%s",
                tty_ ? "\r" : "", static_cast<long long>(step), static_cast<long long>(total_),
                static_cast<long long>(std::min(epoch + 1, epochs)), static_cast<long long>(epochs),
                loss_sum_ / std::max<int64_t>(loss_n_, 1), sps * static_cast<double>(global_batch),
                format_duration(el).c_str(), format_duration(eta).c_str(), tty_ ? "   " : "\n");
    if (tty_ && last) std::printf("\n");
    std::fflush(stdout);
    loss_sum_ = 0;
    loss_n_ = 0;
    last_print_ = Clock::now();
  }

  void end_line() {
    if (tty_) {
      std::printf("\n");
      std::fflush(stdout);
    }
  }

 private:
  bool enabled_, tty_;
  int64_t total_, every_;
  int64_t start_step_ = 0;
  Clock::time_point start_, last_print_;
  double loss_sum_ = 0;
  int64_t loss_n_ = 0;
};

struct SignalScope {
  SignalScope() { stop_signal::install(); }
  ~SignalScope() { stop_signal::uninstall(); }
};

}  // namespace

TrainResult run_training(const TrainConfig& config, Comm& comm) {
  SignalScope signals;
  const int rank = comm.rank(), world = comm.size();
  const bool root = rank == 0;
  TrainResult result;

  // Validate first, on every rank, and agree: nothing collective happens until all ranks are fine.
  {
    std::string err;
    try {
      // The global batch the run will use: the checkpoint's, unless --batch-size is given (or nothing resumes).
      if (config.batch_size_set || config.resume == "none") check_global_batch(config.batch_size, world);
      validate_environment(config);
    } catch (const std::exception& e) {
      err = e.what();
    }
    comm.raise_if_any(err);
  }
  torch::set_num_threads(config.threads);

  // Data: every rank holds the whole (small) data set; the sampler picks each rank's share.
  std::string err;
  ImageDataset train_set, test_set;
  try {
    train_set = read_fashion_mnist(config.data_dir, "train");
    if (config.evaluate) test_set = read_fashion_mnist(config.data_dir, "t10k");
  } catch (const std::exception& e) {
    err = e.what();
  }
  comm.raise_if_any(err);
  auto train_images = torch::from_blob(train_set.images.data(), {train_set.count, 1, train_set.rows, train_set.cols});
  auto train_labels = torch::from_blob(train_set.labels.data(), {train_set.count}, torch::kLong);

  // Same initial weights everywhere (DDP broadcasts rank 0's anyway), then per-rank dropout streams.
  torch::manual_seed(config.seed);
  std::shared_ptr<Model> model = make_model(config.model);
  auto optimizer = make_optimizer(config, model->parameters());
  DistributedDataParallel ddp(model, comm);
  TorchStateBinding binding(*model, *optimizer, config.optimizer);
  seed_rank_rng(config.seed, rank);
  if (root) log::root_info("model: " + model->describe());

  Counters counters;
  DataState data;
  data.seed = config.seed;
  data.global_batch = config.batch_size;

  // Resume: --resume auto loads the newest checkpoint that loads (none: fresh start), or an explicit path.
  // --init-from takes the weights of a file.
  // Loads `path` into the model and optimizer (the optimizer's own state only when resuming).
  auto load_from = [&](const std::string& path, bool resume) -> TrainState {
    const CheckpointManifest manifest = read_manifest(comm, path);
    std::string mismatch;
    if (resume && manifest.optimizer_type != config.optimizer)
      mismatch = "checkpoint " + path + " was trained with --optimizer " + manifest.optimizer_type +
                 ", this run uses " + config.optimizer;
    comm.raise_if_any(mismatch);
    std::vector<TensorRef> entries;
    for (const auto& t : manifest.optimizer_state) entries.push_back(TensorRef{t.name, t.dtype, t.shape, nullptr});
    TrainState st;
    // --init-from takes the weights only, but the load needs a destination for every tensor in the file.
    std::unique_ptr<torch::optim::Optimizer> scratch_opt;
    std::unique_ptr<TorchStateBinding> scratch_binding;
    TorchStateBinding* b = &binding;
    // A weights-only file (optimizer type "", e.g. from h5ddp-ckpt import) has no optimizer state to hold.
    if (!resume && !manifest.optimizer_type.empty() && manifest.optimizer_type != config.optimizer) {
      std::vector<torch::Tensor> params = model->parameters();
      TrainConfig other = config;
      other.optimizer = manifest.optimizer_type;
      scratch_opt = make_optimizer(other, params);
      scratch_binding = std::make_unique<TorchStateBinding>(*model, *scratch_opt, other.optimizer);
      b = scratch_binding.get();
    }
    with_context("loading " + path, [&] {
      b->prepare_import(entries, st);
      load_checkpoint(comm, path, st);
      b->finish_import();
    });
    return st;
  };

  std::optional<std::string> resume_path;
  TrainState st;
  if (config.resume == "auto") {
    // Each candidate is read once: load_checkpoint verifies every checksum as it reads; a damaged one falls
    // back to the next, another model or optimizer fails the run (resume_newest).
    bool attempted = false;
    resume_path = resume_newest(comm, config.run_dir, [&](const std::string& path) {
      attempted = true;
      st = load_from(path, true);
    });
    if (attempted && !resume_path) {
      // The failed loads may have overwritten part of the weights and the optimizer state: start exactly as
      // a run in an empty directory does (same seed, same initial weights, same RNG streams).
      torch::manual_seed(config.seed);
      std::shared_ptr<Model> fresh = make_model(config.model);
      torch::NoGradGuard no_grad;
      auto fresh_params = fresh->named_parameters(true), fresh_buffers = fresh->named_buffers(true);
      for (auto& p : model->named_parameters(true)) p.value().copy_(fresh_params[p.key()]);
      for (auto& b : model->named_buffers(true)) b.value().copy_(fresh_buffers[b.key()]);
      optimizer->state().clear();
      seed_rank_rng(config.seed, rank);
    }
  } else if (config.resume != "none") {
    resume_path = config.resume;
    st = load_from(*resume_path, true);
  }
  // A later --resume auto takes the highest step in the run dir: say which files of an older run would shadow.
  if (config.resume == "none") warn_of_checkpoints_in_fresh_run_dir(comm, config.run_dir);
  if (!resume_path && !config.init_from.empty()) {
    load_from(config.init_from, false);
    optimizer->state().clear();
    if (root) log::root_info("initialised the weights from " + config.init_from);
  }
  if (resume_path) {
    counters = st.counters;
    data = st.data;
    if (config.batch_size_set && config.batch_size != data.global_batch) {
      log::root_info("warning: --batch-size " + std::to_string(config.batch_size) + " differs from the " +
                     std::to_string(data.global_batch) + " of the checkpoint; continuing with " +
                     std::to_string(config.batch_size) + " from sample " + std::to_string(data.position));
      data.global_batch = config.batch_size;
    }
    if (data.seed != config.seed)
      log::root_info("note: the data order continues with the checkpoint's seed " + std::to_string(data.seed));
    const bool exact = restore_rank_rng(st.rng_by_rank, rank, config.seed, counters.step);
    const int exact_all = comm.all_ok(exact) ? 1 : 0;
    result.resumed_from = *resume_path;
    if (root)
      log::root_info("resumed from " + *resume_path + " at step " + std::to_string(counters.step) + ", epoch " +
                     std::to_string(data.epoch) + ", sample " + std::to_string(data.position) + " (saved at " +
                     std::to_string(st.saved_world_size) + " ranks, now " + std::to_string(world) +
                     (exact_all ? "" : "; ranks beyond the saved world size got derived RNG streams") + ")");
  }

  {
    std::string bad_batch;  // the checkpoint's global batch at another world size (the same verdict everywhere)
    try {
      check_global_batch(data.global_batch, world);
    } catch (const Error& e) {
      bad_batch = std::string(e.what()) + (resume_path ? " (the global batch of " + *resume_path +
                                                             "; pass --batch-size to change it)"
                                                       : "");
    }
    comm.raise_if_any(bad_batch);
  }
  DistributedSampler sampler(train_set.count, data.global_batch, data.seed, world, rank);
  // The steps to the end of the last epoch, counted from where the data position is: after a resume with another
  // --batch-size the steps already taken were of another size (equal to steps_per_epoch() * epochs otherwise).
  const int64_t planned = counters.step +
                          (data.epoch < config.epochs
                               ? (train_set.count - data.position) / data.global_batch +
                                     sampler.steps_per_epoch() * (config.epochs - data.epoch - 1)
                               : 0);
  const int64_t total_steps = config.max_steps > 0 ? std::min(config.max_steps, planned) : planned;
  LrSchedule schedule;
  schedule.type = config.lr_schedule;
  schedule.base_lr = config.lr;
  schedule.step_size = config.lr_step_size > 0 ? config.lr_step_size : sampler.steps_per_epoch();
  schedule.gamma = config.lr_gamma;
  schedule.total_steps = total_steps;

  std::map<std::string, std::string> meta = {{"model", config.model.name},
                                             {"model_description", model->describe()},
                                             {"optimizer", config.optimizer},
                                             {"dropout", std::to_string(config.model.dropout)}};
  if (config.model.name == "mlp") {
    std::string w;
    for (int64_t h : config.model.mlp_hidden) w += (w.empty() ? "" : ",") + std::to_string(h);
    meta["mlp_hidden"] = w;
  }

  int64_t last_saved_step = result.resumed_from.empty() ? -1 : counters.step;
  // --async-checkpoint: training blocks only for the copy into host buffers; the final save and a
  // signal's save wait for the file to be committed before the process exits.
  std::unique_ptr<AsyncCheckpointer> async;
  if (config.async_checkpoint) async = std::make_unique<AsyncCheckpointer>(comm);
  auto save = [&](bool wait_for_commit) {
    TrainState st;
    binding.export_state(st);
    st.counters = counters;
    st.data = data;
    st.scheduler = schedule.to_state(counters.step);
    st.meta = meta;
    SaveOptions o;
    o.fsync = config.fsync;
    o.keep_last = config.keep_last;
    o.keep_every = config.keep_every;
    o.verify_replicas = config.verify_replicas;
    last_saved_step = counters.step;
    if (async) {
      async->start(st, config.run_dir, o);
      if (wait_for_commit) result.last_checkpoint = async->wait().path;
      return;
    }
    const SaveResult r = save_checkpoint(comm, st, config.run_dir, o);
    result.last_checkpoint = r.path;
    log::debug("saved " + r.path + " in " + std::to_string(r.seconds) + " s");
  };

  // --on-save-error continue: a failed periodic save (thrown on every rank alike, the previous checkpoint and
  // `latest` untouched) is reported and retried at the next trigger. Final and signal saves always throw.
  const int64_t no_save = last_saved_step;
  auto report_or_throw = [&](const Error& e, bool final_save) {
    if (final_save || config.on_save_error != "continue") throw;
    if (root)
      log::warn("checkpoint save failed; training continues (--on-save-error continue) and retries at the next "
                "trigger; the previous checkpoint and `latest` are unchanged:\n" + std::string(e.what()));
  };
  auto save_or_report = [&](bool final_save) {
    const int64_t previous = last_saved_step;
    try {
      if (async && async->in_flight()) async->wait();  // start() would wait too: surface its failure here
    } catch (const Error& e) {
      last_saved_step = no_save;
      report_or_throw(e, final_save);
    }
    try {
      save(final_save);
    } catch (const Error& e) {
      last_saved_step = previous;
      report_or_throw(e, final_save);
    }
  };
  // --watchdog-seconds: a stalled step or save aborts the job with a message instead of hanging it. auto (the
  // default): 20x the slowest step and 10x the slowest save this process has seen, with generous floors
  // (tests: H5DDP_WATCHDOG_FLOOR_SECONDS sets the step floor, and the save floor to 3x it; a test-only hook,
  // armed only with H5DDP_TEST_HOOKS=1, so a stray variable cannot abort a real run).
  const bool auto_watchdog = config.watchdog_seconds < 0;
  const char* hooks = std::getenv("H5DDP_TEST_HOOKS");
  const char* floor_env = hooks && std::string(hooks) == "1" ? std::getenv("H5DDP_WATCHDOG_FLOOR_SECONDS") : nullptr;
  const double step_floor = floor_env ? std::max(0.1, std::atof(floor_env)) : kAutoWatchdogStepFloor;
  AutoLimit step_limit(step_floor, 20), save_limit(floor_env ? 3 * step_floor : kAutoWatchdogSaveFloor, 10);
  Watchdog watchdog(auto_watchdog ? step_floor : config.watchdog_seconds);
  enum class Watched { kStep, kSave };
  auto watch = [&](const char* what, Watched kind) {
    if (!watchdog.enabled()) return Watchdog::Guard();
    const double limit = auto_watchdog ? (kind == Watched::kStep ? step_limit : save_limit).seconds()
                                       : (kind == Watched::kStep ? 1 : 10) * config.watchdog_seconds;
    return watchdog.guard(std::string(what) + " at step " + std::to_string(counters.step + 1), limit);
  };

  Progress progress(root, config.progress, total_steps, config.log_every);
  progress.start(counters.step);
  auto last_save_time = Clock::now();
  const auto t_start = Clock::now();
  int stop_code = 0;
  model->train();

  while (counters.step < total_steps && data.epoch < config.epochs) {
    const auto step_start = Clock::now();
    auto step_guard = watch("training step (forward/backward, gradient allreduce, step agreement)", Watched::kStep);
    const auto indices = sampler.local_indices(data.epoch, data.position);
    auto [x, y] = gather(train_images, train_labels, indices);
    set_lr(*optimizer, schedule.lr_at(counters.step));
    ddp.prepare_forward();
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    ddp.finish_backward();
    optimizer->step();
    optimizer->zero_grad();

    ++counters.step;
    counters.samples_consumed += data.global_batch;
    data.position += data.global_batch;
    if (!sampler.has_batch(data.position)) {  // epoch done: the rest of the permutation is dropped
      ++data.epoch;
      data.position = 0;
    }
    counters.epoch = data.epoch;

    // One allreduce per step carries everything the ranks must agree on: the mean loss, any rank's
    // signal (requeue / interrupt), any rank's time trigger.
    const int sig = stop_signal::pending();
    double agree[4] = {loss.item<double>(), (sig == SIGUSR1 || sig == SIGTERM) ? 1.0 : 0.0,
                       sig == SIGINT ? 1.0 : 0.0,
                       (config.checkpoint_every_seconds > 0 &&
                        seconds_since(last_save_time) >= config.checkpoint_every_seconds)
                           ? 1.0
                           : 0.0};
    comm.allreduce(agree, 4, DType::kF64, ReduceOp::kSum);
    const bool last = counters.step >= total_steps || data.epoch >= config.epochs;
    progress.update(counters.step, data.epoch, config.epochs, agree[0] / world, data.global_batch, last);
    if (agree[1] > 0) stop_code = stop_signal::kExitRequeue;
    if (agree[2] > 0) stop_code = stop_signal::kExitInterrupted;

    const bool step_due = config.checkpoint_every_steps > 0 && counters.step % config.checkpoint_every_steps == 0;
    try {
      if (async && async->in_flight()) async->poll();  // a background failure throws here, on all ranks
    } catch (const Error& e) {
      last_saved_step = no_save;
      report_or_throw(e, false);
    }
    step_guard.release();
    step_limit.observe(seconds_since(step_start));
    if (step_due || agree[3] > 0 || stop_code != 0) {
      const auto save_start = Clock::now();
      auto save_guard = watch("checkpoint save", Watched::kSave);
      save_or_report(stop_code != 0);
      last_save_time = Clock::now();
      save_limit.observe(seconds_since(save_start));
    }
    if (stop_code != 0) break;
    if (config.step_sleep_ms > 0) {  // stands for compute in tests: watched like the step it stands for
      auto sleep_guard = watch("step sleep (--step-sleep-ms)", Watched::kStep);
      std::this_thread::sleep_for(std::chrono::milliseconds(config.step_sleep_ms));
    }
  }
  // A signal that arrived after the last step still saves (the final save below) and asks to be requeued
  // only if training is not complete.
  result.train_seconds = seconds_since(t_start);
  result.step = counters.step;
  result.epoch = data.epoch;

  if (stop_code != 0) {
    if (root) {
      progress.end_line();
      std::printf("stopped by a signal at step %lld; saved %s; exit code %d (%s)\n",
                  static_cast<long long>(counters.step), result.last_checkpoint.c_str(), stop_code,
                  stop_code == stop_signal::kExitRequeue ? "requeue me" : "interrupted");
      std::fflush(stdout);
    }
    result.exit_code = stop_code;
    return result;
  }

  if (async) {  // the periodic save in flight first: if it failed, the final save below redoes it
    auto save_guard = watch("wait for the background checkpoint save", Watched::kSave);
    try {
      const SaveResult r = async->wait();
      if (!r.path.empty()) result.last_checkpoint = r.path;
    } catch (const Error& e) {
      last_saved_step = no_save;
      report_or_throw(e, false);
    }
  }
  if (config.final_checkpoint && last_saved_step != counters.step) {
    auto save_guard = watch("final checkpoint save", Watched::kSave);
    save_or_report(true);
  }
  if (config.evaluate) result.test_accuracy = evaluate(*model, test_set, comm);

  if (root) {
    const std::string ckpt = !result.last_checkpoint.empty() ? result.last_checkpoint : result.resumed_from;
    std::printf("trained to step %lld (%lld of %lld epochs complete) in %.1f s at %d ranks\n",
                static_cast<long long>(counters.step), static_cast<long long>(std::min(data.epoch, config.epochs)),
                static_cast<long long>(config.epochs), result.train_seconds, world);
    if (config.evaluate) std::printf("test accuracy: %.2f%% on %lld images\n", 100.0 * result.test_accuracy,
                                     static_cast<long long>(test_set.count));
    if (!ckpt.empty()) {
      const std::string prog = config.command_line.empty() ? "h5ddp-train" : config.command_line[0];
      const std::string dir = std::filesystem::path(prog).parent_path().string();
      std::vector<std::string> args(config.command_line.begin() + (config.command_line.empty() ? 0 : 1),
                                    config.command_line.end());
      std::printf("checkpoint: %s\n", ckpt.c_str());
      std::printf("resume (newest checkpoint of the run dir; raise --epochs/--max-steps to train further):\n"
                  "  mpirun -np %d %s\n",
                  world, shell_join([&] {
                    std::vector<std::string> v{prog};
                    v.insert(v.end(), args.begin(), args.end());
                    return v;
                  }()).c_str());
      std::printf("inspect:\n  %s info %s\n", shell_join({(dir.empty() ? "" : dir + "/") + "h5ddp-ckpt"}).c_str(),
                  shell_join({ckpt}).c_str());
    }
    std::fflush(stdout);
  }
  return result;
}

}  // namespace h5ddp

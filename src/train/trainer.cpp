#include "train/trainer.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "core/log.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/checkpointer.hpp"
#include "h5ddp/ddp.hpp"
#include "h5ddp/device.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/nccl_comm.hpp"  // declares NcclComm in CUDA builds only
#include "h5ddp/sampler.hpp"
#include "h5ddp/stop_signal.hpp"
#include "torch/torch_state.hpp"
#include "train/batch.hpp"
#include "train/data.hpp"
#include "train/data_checks.hpp"
#include "train/dataset.hpp"
#include "train/device_setup.hpp"
#include "train/keep_best.hpp"
#include "train/lr_schedule.hpp"
#include "train/metrics.hpp"
#include "train/models.hpp"
#include "train/progress.hpp"
#include "train/resume_hint.hpp"
#include "train/stall_watch.hpp"

namespace h5ddp {
namespace {

using Clock = std::chrono::steady_clock;

// /meta key of a run started with --init-from: the file its weights came from (docs/METRICS.md).
constexpr const char* kInitFromMeta = "init_from";

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

// Local. The strings of a checkpoint's /meta group; empty when the file cannot be read.
std::map<std::string, std::string> read_checkpoint_meta(const std::string& path) {
  try {
    return CheckpointFile(path).meta();
  } catch (const Error&) {
    return {};
  }
}

struct EvalResult {
  double accuracy = -1;  // fraction of the test set classified correctly (-1: regression, no accuracy)
  double loss = 0;       // mean cross-entropy (regression: mean squared error)
};

// Collective. Each rank scores a contiguous share of the test set; one allreduce sums the shares.
EvalResult evaluate(const TrainModel& model, const Dataset& test, Comm& comm, const Compute& compute) {
  model.module->eval();
  const int64_t n = test.size(), r = comm.rank(), w = comm.size();
  const ScoreSums s = score_rows(model.forward, test, n * r / w, n * (r + 1) / w, 1000, compute);
  double sums[2] = {s.correct, s.loss};
  comm.allreduce(sums, 2, DType::kF64, ReduceOp::kSum);
  model.module->train();
  return EvalResult{test.spec().classification ? sums[0] / static_cast<double>(n) : -1,
                    sums[1] / static_cast<double>(n)};
}

struct SignalScope {  // from the first line: a signal during the data load is not lost
  SignalScope() { stop_signal::install(); }
  ~SignalScope() { stop_signal::uninstall(); }
};

CheckpointerOptions checkpointer_options(const TrainConfig& c) {
  CheckpointerOptions o;
  o.run_dir = c.run_dir;
  o.every_steps = c.checkpoint_every_steps;
  o.every_seconds = c.checkpoint_every_seconds;
  o.keep_last = c.keep_last;
  o.keep_every = c.keep_every;
  o.async = c.async_checkpoint;
  o.fsync = c.fsync;
  o.verify_replicas = c.verify_replicas;
  o.shard_optimizer = c.shard_optimizer;
  o.load.strategy = c.load_strategy == "share-exchange" ? LoadStrategy::kShareExchange : LoadStrategy::kEveryRankReads;
  o.continue_on_save_error = c.on_save_error == "continue";
  return o;
}

// h5ddp-train's loop, one concern per function: options, data, model, resume, schedule, steps, end of run.
// The checkpointing (triggers, signals, saves, resume) is the Checkpointer's, as in a user's own loop.
class Trainer {
 public:
  Trainer(const TrainConfig& config, MpiComm& comm)
      : config_(config),
        comm_(comm),
        root_(comm.rank() == 0),
        watch_(config.watchdog_seconds),
        metrics_(config.run_dir, comm.rank() == 0 && config.metrics) {}

  TrainResult run() {
    try {
      validate_options();
      torch::set_num_threads(config_.threads);
      load_data();
      build_model();
      resume_or_init();
      plan();
      train();
      if (ckpt_->exit_code() != 0) return stopped();
      finish();
    } catch (const std::exception& e) {
      if (ckpt_) metrics_.write(JsonRecord("error").add("step", ckpt_->step()).add("message", e.what()));
      throw;
    }
    return result_;
  }

 private:
  bool evaluates() const { return config_.evaluate || config_.eval_every_steps > 0 || config_.eval_every_epoch; }

  // Collective. Every rank checks what needs no I/O and the ranks agree before anything else happens.
  void validate_options() {
    agreed(comm_, [&] {
      // The global batch the run will use: the checkpoint's, unless --batch-size is given (or nothing resumes).
      if (config_.batch_size_set || config_.resume == "none") check_global_batch(config_.batch_size, comm_.size());
      validate_environment(config_);
    });
  }

  // Collective. Fashion-MNIST: every rank holds the whole (small) set. --data FILE.h5: each rank opens the file
  // and later reads only the rows of its own batches (and its share of the test set). The sampler picks the rows.
  void load_data() {
    agreed(comm_, [&] {
      if (!config_.data_file.empty()) {
        train_set_ = open_h5_dataset(config_.data_file, "train");
        if (evaluates()) {
          if (!h5_dataset_has_split(config_.data_file, "test"))
            throw DataError("--data " + config_.data_file + " /test: missing; evaluation needs it (or pass --no-eval)");
          test_set_ = open_h5_dataset(config_.data_file, "test");
        }
      } else {
        train_set_ = images_dataset(read_fashion_mnist(config_.data_dir, "train"), "fashion-mnist train");
        if (evaluates()) test_set_ = images_dataset(read_fashion_mnist(config_.data_dir, "t10k"), "fashion-mnist t10k");
      }
      if (test_set_ && test_set_->spec().shape != train_set_->spec().shape)
        throw DataError("--data " + config_.data_file + ": /test samples are " + test_set_->spec().shape_text() +
                        " but /train samples are " + train_set_->spec().shape_text());
    });
    if (root_ && !config_.data_file.empty()) log::root_info("data: " + train_set_->describe());
  }

  // Collective. Same initial weights everywhere (DDP broadcasts rank 0's anyway), then per-rank dropout streams.
  void build_model() {
    torch::manual_seed(config_.seed);
    model_ = agreed(comm_, [&] { return build_train_model(config_.model); });
    DeviceSetup device = setup_device(config_, comm_, *model_.module);
    compute_ = device.compute;
    device_comm_ = std::move(device.device_comm);
    check_data_fits_model(model_, *train_set_, test_set_.get(), compute_, config_.keep_best, comm_);
    DdpOptions ddp_options;
    ddp_options.device_comm = device_comm_.get();
    ddp_options.reduce_bf16 = compute_.bf16 && compute_.device.is_cuda();  // NCCL sums bf16; MPI cannot
    ddp_options.shard_optimizer = config_.shard_optimizer;
    ddp_ = std::make_unique<DistributedDataParallel>(model_.module, comm_, ddp_options);
    // After the move to the device (state there); sharded: over this rank's parameters only.
    optimizer_ =
        make_optimizer(config_, config_.shard_optimizer ? ddp_->owned_parameters() : model_.module->parameters());
    ckpt_ = std::make_unique<Checkpointer>(comm_, *model_.module, *optimizer_, checkpointer_options(config_));
    seed_rank_rng(config_.seed, comm_.rank());
    if (root_) log::root_info("model: " + model_.description);
    for (const auto& [key, value] : model_.meta) ckpt_->set_meta(key, value);
    ckpt_->data().seed = config_.seed;
    ckpt_->data().global_batch = config_.batch_size;
  }

  // Collective. --resume auto: the newest checkpoint of the run dir that loads (none: a fresh start exactly
  // like a run in an empty directory); a path: that file; none: fresh. --init-from: weights only.
  void resume_or_init() {
    ResumeInfo info;
    const auto load_start = Clock::now();
    try {
      if (config_.resume == "auto")
        info = ckpt_->resume();
      else if (config_.resume != "none")
        info = ckpt_->resume_from(config_.resume);
    } catch (const CheckpointMismatchError& e) {
      // Which model the refused file holds: from its /meta (the file the error names).
      std::vector<std::string> paths = list_resume_candidates(comm_, config_.run_dir).paths;  // collective
      if (config_.resume != "auto") paths = {config_.resume};
      std::string holds;
      for (const auto& p : paths)
        if (root_ && holds.empty() && std::string(e.what()).find(p) != std::string::npos)
          holds = model_identity_difference(read_checkpoint_meta(p), model_);
      holds = comm_.broadcast_string(holds, 0);  // every rank, whatever rank 0 found
      CheckpointMismatchError more(Error::Untagged{},
                                   std::string(e.what()) + "\n  " +
                                       (holds.empty() ? "this run's model: " + model_.description : holds) +
                                       "; resume with the model that wrote the checkpoint (h5ddp-ckpt info FILE names "
                                       "it in /meta) or train the new model in another --run-dir");
      if (!e.agreed()) throw more;
      throw_agreed(more);  // every rank raised it
    }
    // A later --resume auto takes the highest step in the run dir: say which files of an older run would shadow.
    if (config_.resume == "none") warn_of_checkpoints_in_fresh_run_dir(comm_, config_.run_dir);
    if (info.resumed) {
      const std::string other = model_identity_difference(info.meta, model_);
      comm_.raise_if_any(other.empty() ? "" : "cannot resume from " + info.path + ": " + other);
      check_init_from(info);
      report_resume(info);
    } else if (!config_.init_from.empty()) {
      ckpt_->load_weights(config_.init_from);
      ckpt_->set_meta(kInitFromMeta, config_.init_from);  // a requeued fine-tune resumes its own checkpoints
      if (root_) log::root_info("initialised the weights from " + config_.init_from);
    }
    check_batch(info);
    info_ = info;
    // The steps after the resumed one are redone: their records go, so the log never holds two versions.
    metrics_.truncate_after(info.resumed ? info.step : 0);
    JsonRecord start(info.resumed ? "resume" : "start");
    start.add("step", ckpt_->step()).add("world_size", comm_.size());
    if (info.resumed)
      start.add("from", info.path)
          .add("saved_world_size", info.saved_world_size)
          .add("load_seconds", seconds_since(load_start));
    metrics_.write(start);
    if (config_.keep_best) {
      best_ = std::make_unique<KeepBest>(config_.run_dir, config_.fsync, *ckpt_, comm_);
      best_->load();
    }
  }

  // Collective (the same verdict everywhere: every rank read the same /meta). --init-from starts a fresh run;
  // in a run dir that already holds a checkpoint it applies only when that checkpoint's run was started from the
  // same file (the fine-tune requeued). Anything else is refused, naming both files: resuming the run dir's
  // checkpoint silently would "fine-tune" from the wrong weights.
  void check_init_from(const ResumeInfo& info) {
    const auto it = info.meta.find(kInitFromMeta);
    const std::string started_from = it == info.meta.end() ? "" : it->second;
    if (!started_from.empty()) ckpt_->set_meta(kInitFromMeta, started_from);  // provenance kept by later saves
    if (config_.init_from.empty()) return;
    // Agreed: same_file asks each rank's view of the file system, which need not be the same on every node.
    agreed(comm_, [&] {
      if (same_file(started_from, config_.init_from)) return;
      throw ConfigError(
          "--init-from " + config_.init_from + " starts a fresh run, but the run dir " + config_.run_dir +
          " already holds checkpoints: --resume auto found " + info.path +
          (started_from.empty() ? " (not started from an --init-from file)" : " (started from " + started_from + ")") +
          ". Give the fine-tune its own --run-dir, or pass --resume none to start over in this one from " +
          config_.init_from);
    });
    if (root_)
      log::root_info("--init-from " + config_.init_from + ": " + info.path +
                     " continues the run started from it; resuming that checkpoint");
  }

  static bool same_file(const std::string& a, const std::string& b) {
    if (a.empty() || b.empty()) return false;
    std::error_code ec;
    const bool same = std::filesystem::equivalent(a, b, ec);
    return ec ? a == b : same;
  }

  void report_resume(const ResumeInfo& info) {
    DataState& data = ckpt_->data();
    if (config_.batch_size_set && config_.batch_size != data.global_batch) {
      log::root_info("warning: --batch-size " + std::to_string(config_.batch_size) + " differs from the " +
                     std::to_string(data.global_batch) + " of the checkpoint; continuing with " +
                     std::to_string(config_.batch_size) + " from sample " + std::to_string(data.position));
      data.global_batch = config_.batch_size;
    }
    if (data.seed != config_.seed)
      log::root_info("note: the data order continues with the checkpoint's seed " + std::to_string(data.seed));
    result_.resumed_from = info.path;
    if (root_)
      log::root_info("resumed from " + info.path + " at step " + std::to_string(info.step) + ", epoch " +
                     std::to_string(data.epoch + 1) + ", sample " + std::to_string(data.position) + " (saved at " +
                     std::to_string(info.saved_world_size) + " ranks, now " + std::to_string(comm_.size()) +
                     (info.rng_exact ? "" : "; ranks beyond the saved world size got derived RNG streams") + ")");
  }

  // Collective. The checkpoint's global batch at another world size: the same verdict on every rank.
  void check_batch(const ResumeInfo& info) {
    std::string bad_batch;
    try {
      check_global_batch(ckpt_->data().global_batch, comm_.size());
    } catch (const Error& e) {
      bad_batch = std::string(e.what()) +
                  (info.resumed ? " (the global batch of " + info.path + "; pass --batch-size to change it)" : "");
    }
    if (bad_batch.empty() && (ckpt_->data().global_batch / comm_.size()) % config_.grad_accum != 0)
      bad_batch = "--grad-accum " + std::to_string(config_.grad_accum) + " does not divide the " +
                  std::to_string(ckpt_->data().global_batch / comm_.size()) + " samples per rank of the global batch " +
                  std::to_string(ckpt_->data().global_batch) + " at " + std::to_string(comm_.size()) + " ranks";
    comm_.raise_if_any(bad_batch);
  }

  // The steps to the end of the last epoch, counted from where the data position is: after a resume with
  // another --batch-size the steps already taken were of another size.
  void plan() {
    const DataState& data = ckpt_->data();
    sampler_ = std::make_unique<DistributedSampler>(train_set_->size(), data.global_batch, data.seed, comm_.size(),
                                                    comm_.rank());
    const int64_t step = ckpt_->step();
    const int64_t planned =
        step + (data.epoch < config_.epochs ? (train_set_->size() - data.position) / data.global_batch +
                                                  sampler_->steps_per_epoch() * (config_.epochs - data.epoch - 1)
                                            : 0);
    total_steps_ = config_.max_steps > 0 ? std::min(config_.max_steps, planned) : planned;
    schedule_.type = config_.lr_schedule;
    schedule_.base_lr = config_.lr;
    schedule_.step_size = config_.lr_step_size > 0 ? config_.lr_step_size : sampler_->steps_per_epoch();
    schedule_.gamma = config_.lr_gamma;
    schedule_.total_steps = total_steps_;
    schedule_.warmup_steps = config_.lr_warmup_steps;
    if (info_.resumed && !config_.replan_lr_schedule) continue_schedule();
    ckpt_->set_scheduler_state([this](int64_t s) { return schedule_.to_state(s); });
    metrics_interval_ = config_.log_every > 0 ? config_.log_every : std::max<int64_t>(1, total_steps_ / 200);
  }

  // Collective (the same verdict everywhere). After a resume the checkpoint's schedule continues with its
  // horizon (continued_schedule); options that would change its shape are an error unless --replan-lr-schedule.
  void continue_schedule() {
    std::string note;
    schedule_ =
        agreed(comm_, [&] { return continued_schedule(info_.scheduler, schedule_, info_.path, info_.step, &note); });
    if (root_ && !note.empty()) log::root_info(note);
  }

  bool done() const { return ckpt_->step() >= total_steps_ || ckpt_->data().epoch >= config_.epochs; }

  void train() {
    progress_ = std::make_unique<Progress>(root_, config_.progress, total_steps_, config_.log_every);
    progress_->start(ckpt_->step());
    t_start_ = interval_start_ = Clock::now();
    model_.module->train();
    if (done() && info_.resumed && root_) say_nothing_to_train();
    while (!done())
      if (!step()) break;
    result_.train_seconds = seconds_since(t_start_);
    result_.step = ckpt_->step();
    result_.epoch = ckpt_->data().epoch;
    result_.last_checkpoint = ckpt_->last_checkpoint();
  }

  // Rank 0. A resume whose checkpoint already reached --max-steps or --epochs ends at once: say so, not only
  // "trained to step N in 0.0 s".
  void say_nothing_to_train() const {
    const DataState& data = ckpt_->data();
    const bool by_steps = config_.max_steps > 0 && ckpt_->step() >= config_.max_steps;
    log::root_info(
        "note: nothing to train: " + info_.path + " is at step " + std::to_string(ckpt_->step()) + " (" +
        std::to_string(data.epoch) + " epochs complete), already at " +
        (by_steps ? "--max-steps " + std::to_string(config_.max_steps) : "--epochs " + std::to_string(config_.epochs)) +
        "; raise --epochs/--max-steps to train further (or start over with --resume none)");
  }

  // Collective. One optimizer step, then the Checkpointer's agreement, evaluation and saves. False: a stop
  // signal (saved).
  bool step() {
    const auto step_start = Clock::now();
    const int64_t step = ckpt_->step();
    auto guard = watch_.watch("training step (forward/backward, gradient allreduce, step agreement)",
                              StallWatch::Kind::kStep, step);
    DataState& data = ckpt_->data();
    set_lr(*optimizer_, schedule_.lr_at(step));
    const double loss = forward_backward(sampler_->local_indices(data.epoch, data.position));
    optimizer_->step();
    if (config_.shard_optimizer) ddp_->gather_parameters();
    optimizer_->zero_grad();
    const bool epoch_ended = sampler_->advance(data);  // the rest of the permutation that fills no batch is dropped

    StepOutcome outcome = ckpt_->agree_step(step + 1, loss);
    progress_->update(step + 1, data.epoch, config_.epochs, outcome.value_mean, data.global_batch, done());
    record_train(step + 1, outcome.value_mean);
    guard.release();
    watch_.observe(StallWatch::Kind::kStep, seconds_since(step_start));
    const bool eval_due = (config_.eval_every_steps > 0 && (step + 1) % config_.eval_every_steps == 0) ||
                          (config_.eval_every_epoch && epoch_ended);
    const auto pause_start = Clock::now();                   // evaluations and saves do not count as training time
    if (eval_due || outcome.save_due) ddp_->sync_buffers();  // rank 0's BatchNorm statistics everywhere
    std::optional<EvalResult> eval;
    if (eval_due) eval = evaluate_now();
    const bool new_best = eval && best_ && best_->offer(eval->accuracy, step + 1);
    if (outcome.save_due) {
      const auto save_start = Clock::now();
      auto save_guard = watch_.watch("checkpoint save", StallWatch::Kind::kSave, step + 1);
      ckpt_->save_if_due(outcome);
      watch_.observe(StallWatch::Kind::kSave, seconds_since(save_start));
      record_save();
    }
    if (new_best)
      best_->commit([&] {
        auto save_guard = watch_.watch("best checkpoint save", StallWatch::Kind::kSave, ckpt_->step());
        ckpt_->save();
        record_save();
      });
    interval_start_ += Clock::now() - pause_start;
    if (outcome.stop) return false;
    if (config_.step_sleep_ms > 0) {  // stands for compute in tests: watched like the step it stands for
      auto sleep_guard = watch_.watch("step sleep (--step-sleep-ms)", StallWatch::Kind::kStep, step + 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(config_.step_sleep_ms));
    }
    return true;
  }

  // Collective. Forward and backward of this rank's share of the global batch in --grad-accum micro-batches;
  // only the last one reduces gradients (DDP no_sync before it). Returns this rank's mean loss.
  double forward_backward(const std::vector<int64_t>& indices) {
    const int64_t k = config_.grad_accum, micro = static_cast<int64_t>(indices.size()) / k;
    double loss_sum = 0;
    for (int64_t m = 0; m < k; ++m) {
      std::optional<DistributedDataParallel::NoSync> local;
      if (m + 1 < k) local.emplace(ddp_->no_sync());
      const std::vector<int64_t> part(indices.begin() + m * micro, indices.begin() + (m + 1) * micro);
      auto [x, y] = batch_tensors(*train_set_, part);
      x = x.to(compute_.device, /*non_blocking=*/false);
      y = y.to(compute_.device);
      ddp_->prepare_forward();
      torch::Tensor loss;
      {
        AutocastScope autocast(compute_);
        loss = batch_loss(train_set_->spec(), model_.forward(x), y);
      }
      if (k > 1) loss = loss / static_cast<double>(k);
      loss.backward();
      ddp_->finish_backward();
      loss_sum += loss.item<double>();
    }
    return loss_sum;
  }

  // Collective. A distributed evaluation during training: in the metrics log and in the next checkpoint's meta.
  EvalResult evaluate_now() {
    const EvalResult r = evaluate(model_, *test_set_, comm_, compute_);
    char acc[32];
    std::snprintf(acc, sizeof acc, "%.6f", r.accuracy);
    ckpt_->set_meta("eval_accuracy", acc);
    ckpt_->set_meta("eval_step", std::to_string(ckpt_->step()));
    metrics_.write(JsonRecord("eval")
                       .add("step", ckpt_->step())
                       .add("epoch", ckpt_->data().epoch)
                       .add("accuracy", r.accuracy)
                       .add("loss", r.loss));
    if (root_) {  // also on the console: the metrics log is not the only place an evaluation shows
      progress_->end_line();
      if (r.accuracy >= 0)
        std::printf("eval at step %lld: test accuracy %.2f%%, loss %.4f on %lld samples\n",
                    static_cast<long long>(ckpt_->step()), 100.0 * r.accuracy, r.loss,
                    static_cast<long long>(test_set_->size()));
      else
        std::printf("eval at step %lld: test loss (mean squared error) %.6g on %lld samples\n",
                    static_cast<long long>(ckpt_->step()), r.loss, static_cast<long long>(test_set_->size()));
      std::fflush(stdout);
    }
    return r;
  }

  // Rank 0's metrics: a "train" record every metrics_interval_ steps (mean loss over the interval).
  void record_train(int64_t step, double loss) {
    interval_loss_ += loss;
    ++interval_steps_;
    if (step % metrics_interval_ != 0 && !done()) return;
    const double el = seconds_since(interval_start_);
    metrics_.write(JsonRecord("train")
                       .add("step", step)
                       .add("epoch", ckpt_->data().epoch)
                       .add("loss", interval_loss_ / static_cast<double>(interval_steps_))
                       .add("lr", schedule_.lr_at(step - 1))
                       .add("samples_per_s",
                            el > 0 ? static_cast<double>(interval_steps_ * ckpt_->data().global_batch) / el : 0.0));
    interval_loss_ = 0;
    interval_steps_ = 0;
    interval_start_ = Clock::now();
  }

  // Rank 0's metrics: the save just made (once per save).
  void record_save() {
    const SaveStats& s = ckpt_->last_save();
    if (s.step < 0 || s.step == recorded_save_step_) return;
    recorded_save_step_ = s.step;
    JsonRecord r("save");
    r.add("step", s.step).add("path", s.path).add("async", s.async).add("blocked_seconds", s.blocked_seconds);
    if (s.async)
      r.add_null("seconds");  // written in the background: known when it commits
    else
      r.add("seconds", s.seconds);
    metrics_.write(r.add("bytes", static_cast<int64_t>(s.bytes)));
  }

  // A signal (also one after the last step) saved the state; training asks to be requeued.
  TrainResult stopped() {
    if (root_) {
      progress_->end_line();
      std::printf("stopped by a signal at step %lld; saved %s; exit code %d (%s)\n",
                  static_cast<long long>(ckpt_->step()), ckpt_->last_checkpoint().c_str(), ckpt_->exit_code(),
                  ckpt_->exit_code() == stop_signal::kExitRequeue ? "requeue me" : "interrupted");
      std::fflush(stdout);
    }
    result_.exit_code = ckpt_->exit_code();
    record_save();
    metrics_.write(JsonRecord("stop")
                       .add("step", ckpt_->step())
                       .add("exit_code", result_.exit_code)
                       .add("signal", result_.exit_code == stop_signal::kExitRequeue ? "SIGUSR1/SIGTERM" : "SIGINT")
                       .add("checkpoint", ckpt_->last_checkpoint()));
    return result_;
  }

  // Collective. The background save in flight, the final save, the evaluation, the summary.
  void finish() {
    {
      ddp_->sync_buffers();
      auto guard =
          watch_.watch(config_.final_checkpoint ? "final checkpoint save" : "wait for the background checkpoint save",
                       StallWatch::Kind::kSave, ckpt_->step());
      ckpt_->finish(config_.final_checkpoint);
    }
    result_.last_checkpoint = ckpt_->last_checkpoint();
    record_save();
    JsonRecord end("end");
    end.add("step", ckpt_->step()).add("epoch", ckpt_->data().epoch).add("exit_code", 0);
    end.add("train_seconds", result_.train_seconds);
    if (config_.evaluate) {
      const EvalResult r = evaluate(model_, *test_set_, comm_, compute_);
      result_.test_accuracy = r.accuracy;
      result_.test_loss = r.loss;
      if (r.accuracy >= 0) end.add("test_accuracy", r.accuracy);
      end.add("test_loss", r.loss);
    }
    metrics_.write(end);
    if (root_) print_summary();
  }

  void print_summary() const {
    const int64_t step = ckpt_->step(), epoch = ckpt_->data().epoch;
    std::printf("trained to step %lld (%lld of %lld epochs complete) in %.1f s at %d ranks\n",
                static_cast<long long>(step), static_cast<long long>(std::min(epoch, config_.epochs)),
                static_cast<long long>(config_.epochs), result_.train_seconds, comm_.size());
    if (config_.evaluate && result_.test_accuracy >= 0)
      std::printf("test accuracy: %.2f%% on %lld images\n", 100.0 * result_.test_accuracy,
                  static_cast<long long>(test_set_->size()));
    else if (config_.evaluate)
      std::printf("test loss (mean squared error): %.6g on %lld samples\n", result_.test_loss,
                  static_cast<long long>(test_set_->size()));
    const std::string ckpt = !result_.last_checkpoint.empty() ? result_.last_checkpoint : result_.resumed_from;
    if (!ckpt.empty()) print_next_commands(ckpt);
    std::fflush(stdout);
  }

  void print_next_commands(const std::string& ckpt) const {
    ResumeHintFacts facts;
    facts.argv = config_.command_line;
    facts.world_size = comm_.size();
    facts.root_user = ::geteuid() == 0;
    facts.oversubscribed = config_.local_size > static_cast<int>(std::thread::hardware_concurrency());
    if (const char* hint = std::getenv("H5DDP_RESUME_HINT")) facts.launcher_hint = hint;
    const std::string program = facts.argv.empty() ? std::string("h5ddp-train") : facts.argv[0];
    const std::string dir = std::filesystem::path(program).parent_path().string();
    std::printf("checkpoint: %s\n", ckpt.c_str());
    std::printf("resume (newest checkpoint of the run dir; raise --epochs/--max-steps to train further):\n  %s\n",
                resume_command(facts).c_str());
    std::printf("inspect:\n  %s info %s\n", shell_join({(dir.empty() ? "" : dir + "/") + "h5ddp-ckpt"}).c_str(),
                shell_join({ckpt}).c_str());
  }

  const TrainConfig& config_;
  MpiComm& comm_;
  const bool root_;
  SignalScope signals_;
  StallWatch watch_;
  TrainResult result_;
  std::unique_ptr<Dataset> train_set_, test_set_;
  TrainModel model_;
  Compute compute_;                    // --device, --precision
  std::unique_ptr<Comm> device_comm_;  // NcclComm with --device cuda
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<Progress> progress_;
  LrSchedule schedule_;
  int64_t total_steps_ = 0;
  Clock::time_point t_start_;
  MetricsLog metrics_;
  ResumeInfo info_;               // what the resume found (resumed false: a fresh start)
  int64_t metrics_interval_ = 1;  // steps per "train" record
  double interval_loss_ = 0;
  int64_t interval_steps_ = 0;
  Clock::time_point interval_start_;
  int64_t recorded_save_step_ = -1;  // the last save written to the metrics log
  std::unique_ptr<KeepBest> best_;   // --keep-best
};

}  // namespace

TrainResult run_training(const TrainConfig& config, MpiComm& comm) {
  return Trainer(config, comm).run();
}

}  // namespace h5ddp

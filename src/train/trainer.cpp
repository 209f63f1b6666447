#include "train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

#include "h5ddp/checkpointer.hpp"
#include "h5ddp/clock.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/nccl_comm.hpp"  // declares NcclComm in CUDA builds only
#include "h5ddp/sampler.hpp"
#include "h5ddp/stop_signal.hpp"
#include "h5ddp/torch_state.hpp"
#include "train/auto_interval.hpp"
#include "train/batch.hpp"
#include "train/data_checks.hpp"
#include "train/dataset.hpp"
#include "train/device_setup.hpp"
#include "train/goodput.hpp"
#include "train/keep_best.hpp"
#include "train/loop_setup.hpp"
#include "train/lr_schedule.hpp"
#include "train/models.hpp"
#include "train/parallel_model.hpp"
#include "train/progress.hpp"
#include "train/resume_hint.hpp"
#include "train/run_log.hpp"
#include "train/run_start.hpp"
#include "train/stall_watch.hpp"

namespace h5ddp {
namespace {

SaveRecord save_record(const SaveStats& s) {
  return SaveRecord{s.step, s.path, s.async, s.blocked_seconds, s.seconds, s.bytes};
}

struct SignalScope {  // from the first line: a signal during the data load is not lost
  SignalScope() { stop_signal::install(); }
  ~SignalScope() { stop_signal::uninstall(); }
};

// h5ddp-train's loop: an orchestrator of components, each in a file of its own (data and its checks, device
// setup, the model, run start, lr schedule, progress, stall watch, keep-best, run log and console text). The
// checkpointing (triggers, signals, saves, resume) is the Checkpointer's, as in a user's own loop.
class Trainer {
 public:
  Trainer(const TrainConfig& config, MpiComm& comm)
      : config_(config),
        comm_(comm),
        root_(comm.rank() == 0),
        watch_(config.watchdog_seconds),
        log_(config.run_dir, comm.rank() == 0 && config.metrics) {}

  TrainResult run() {
    try {
      agreed(comm_, [&] {  // what needs no I/O, agreed before anything else happens
        // The global batch the run will use: the checkpoint's, unless --batch-size is given (or nothing resumes).
        if (config_.batch_size_set || config_.resume == ResumeMode::kNone)
          check_global_batch(config_.batch_size, comm_.size());
        validate_environment(config_);
      });
      torch::set_num_threads(config_.threads);
      ParallelModel::tune_heap(config_);
      load_data();
      build_model();
      start();
      plan();
      train();
      if (ckpt_->exit_code() != 0) return stopped();
      finish();
    } catch (const std::exception& e) {
      if (ckpt_) log_.error(ckpt_->step(), e.what());
      throw;
    }
    return result_;
  }

 private:
  bool evaluates() const { return config_.evaluate || config_.eval_every_steps > 0 || config_.eval_every_epoch; }

  // Collective. Fashion-MNIST (every rank holds the small set) or --data FILE.h5 (each rank reads its rows).
  void load_data() {
    TrainData data = agreed(
        comm_, [&] { return open_train_data(config_.data_file, config_.data_dir, evaluates(), config_.context); });
    train_set_ = std::move(data.train);
    test_set_ = std::move(data.test);
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
    parallel_ = std::make_unique<ParallelModel>(config_, comm_, model_, compute_, device_comm_.get());
    ckpt_ = parallel_->checkpointer(comm_, checkpointer_options(config_));
    seed_rank_rng(config_.seed, comm_.rank());
    if (root_) log::root_info("model: " + model_.description);
    parallel_->log_shards();
    for (const auto& [key, value] : model_.meta) ckpt_->set_meta(key, value);
    if (!config_.data_file.empty()) ckpt_->set_meta("data_file", config_.data_file);  // h5ddp-ckpt eval's default
    ckpt_->data().seed = config_.seed;
    ckpt_->data().global_batch = config_.batch_size;
  }

  // Collective. --resume auto | PATH | none, --init-from (run_start.hpp); the run log starts; keep-best takes over.
  void start() {
    const RunStart start = start_run(config_, *ckpt_, comm_, model_);
    info_ = start.info;
    if (info_.resumed) result_.resumed_from = info_.path;
    log_.truncate_after(info_.resumed ? info_.step : 0);  // the steps after the resumed one are redone
    if (info_.resumed)
      log_.resume(ckpt_->step(), comm_.size(), info_.path, info_.saved_world_size, start.load_seconds);
    else
      log_.start(ckpt_->step(), comm_.size());
    if (config_.keep_best) {
      best_ = std::make_unique<KeepBest>(config_.run_dir, config_.fsync, *ckpt_, comm_);
      best_->load();
    }
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
    schedule_ = schedule_for(config_.lr_schedule, config_.lr, config_.lr_step_size, config_.lr_gamma,
                             config_.lr_warmup_steps, sampler_->steps_per_epoch(), total_steps_);
    if (info_.resumed && !config_.replan_lr_schedule) {  // the checkpoint's schedule continues (agreed verdict)
      std::string note;
      schedule_ =
          agreed(comm_, [&] { return continued_schedule(info_.scheduler, schedule_, info_.path, info_.step, &note); });
      if (root_ && !note.empty()) log::root_info(note);
    }
    ckpt_->set_scheduler_state([this](int64_t s) { return schedule_.to_state(s); });
    log_.set_interval(config_.log_every > 0 ? config_.log_every : std::max<int64_t>(1, total_steps_ / 200));
    start_auto_interval();
  }

  bool done() const { return ckpt_->step() >= total_steps_ || ckpt_->data().epoch >= config_.epochs; }

  void train() {
    progress_ = std::make_unique<Progress>(root_, config_.progress, total_steps_, config_.log_every);
    progress_->start(ckpt_->step());
    const auto t_start = Clock::now();
    log_.restart_interval();
    model_.module->train();
    if (done() && info_.resumed && root_)
      log::root_info(
          console::nothing_to_train(info_.path, ckpt_->step(), ckpt_->data().epoch, config_.max_steps, config_.epochs));
    while (!done())
      if (!step()) break;
    result_.train_seconds = seconds_since(t_start);
    result_.step = ckpt_->step();
    result_.epoch = ckpt_->data().epoch;
    result_.last_checkpoint = ckpt_->last_checkpoint();
  }

  // Collective. One optimizer step, then the Checkpointer's agreement, evaluation and saves. False: a stop
  // signal (saved).
  bool step() {
    const auto step_start = Clock::now();
    const int64_t step = ckpt_->step();
    auto guard = watch_.watch("training step (forward/backward, gradient allreduce, step agreement)",
                              StallWatch::Kind::kStep, step);
    DataState& data = ckpt_->data();
    const double loss = forward_backward(sampler_->local_indices(data.epoch, data.position), schedule_.lr_at(step));
    const bool epoch_ended = sampler_->advance(data);  // the rest of the permutation that fills no batch is dropped
    StepOutcome outcome = ckpt_->agree_step(step + 1, loss);
    if (auto_ && step + 1 >= next_auto_save_) outcome.save_due = true;  // the same step on every rank
    progress_->update(step + 1, data.epoch, config_.epochs, outcome.value_mean, data.global_batch, done());
    const SampleSpec& spec = train_set_->spec();
    const bool eval_due = (config_.eval_every_steps > 0 && (step + 1) % config_.eval_every_steps == 0) ||
                          (config_.eval_every_epoch && epoch_ended);
    log_.train(step + 1, data.epoch, outcome.value_mean, schedule_.lr_at(step), data.global_batch,
               done() || outcome.save_due || eval_due, grad_norm_, skipped_steps_, spec.tokens ? spec.numel() : 0);
    guard.release();
    watch_.observe(StallWatch::Kind::kStep, seconds_since(step_start));
    const auto pause_start = Clock::now();  // evaluations and saves do not count as training time
    after_step(step + 1, outcome, eval_due);
    const auto pause = Clock::now() - pause_start;
    log_.pause(pause);
    if (outcome.stop) return false;
    if (config_.step_sleep_ms > 0) {  // stands for compute in tests: watched like the step it stands for
      auto sleep_guard = watch_.watch("step sleep (--step-sleep-ms)", StallWatch::Kind::kStep, step + 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(config_.step_sleep_ms));
    }
    if (auto_) auto_->observe_step(std::chrono::duration<double>(Clock::now() - step_start - pause).count());
    if (auto_ && outcome.save_due) replan_interval(step + 1);
    return true;
  }

  // --checkpoint-every-steps auto: the first interval, from the resumed checkpoint's /meta when it has one.
  void start_auto_interval() {
    if (!config_.checkpoint_auto) return;
    int64_t first = AutoInterval::kFirstSteps;
    const auto it = info_.meta.find(kIntervalMeta);
    if (info_.resumed && it != info_.meta.end()) first = std::max<int64_t>(1, std::atoll(it->second.c_str()));
    auto_.emplace(config_.mtbf_seconds, first);
    next_auto_save_ = ckpt_->step() + auto_->steps();
    ckpt_->set_meta(kIntervalMeta, std::to_string(auto_->steps()));
    log_.interval(ckpt_->step(), auto_->steps(), 0, 0, config_.mtbf_seconds);
    char line[200];
    std::snprintf(line, sizeof line, "checkpoint interval: %lld steps (auto, MTBF %.6g s; %s)",
                  static_cast<long long>(auto_->steps()), config_.mtbf_seconds,
                  it != info_.meta.end() && info_.resumed ? "the resumed checkpoint's, until a save is measured"
                                                          : "until the first save is measured");
    if (root_) log::root_info(line);
  }

  // Collective (every rank saved at this step). Re-estimates the interval from this save's blocked time and the
  // steps since the last one, agreed as the maximum over ranks so every rank computes the same interval.
  void replan_interval(int64_t step) {
    double measured[2] = {ckpt_->last_save().step == step ? last_blocked_ : auto_->save_seconds(),
                          auto_->mean_step_seconds()};
    comm_.allreduce(measured, 2, DType::kF64, ReduceOp::kMax);
    const int64_t before = auto_->steps();
    auto_->update(measured[0], measured[1]);
    next_auto_save_ = step + auto_->steps();
    ckpt_->set_meta(kIntervalMeta, std::to_string(auto_->steps()));
    log_.interval(step, auto_->steps(), auto_->save_seconds(), auto_->step_seconds(), auto_->mtbf_seconds());
    if (root_ && auto_->steps() != before) {
      char line[200];
      std::snprintf(
          line, sizeof line, "checkpoint interval: %lld steps (auto: save blocks %.3g s, step %.3g s, MTBF %.6g s)",
          static_cast<long long>(auto_->steps()), auto_->save_seconds(), auto_->step_seconds(), auto_->mtbf_seconds());
      progress_->end_line();
      log::root_info(line);
    }
  }

  // Rank 0, with the metrics log: the goodput of this segment and of the run so far (goodput.hpp).
  void print_goodput() const {
    if (!root_ || !log_.enabled()) return;
    try {
      std::printf("%s\n", goodput_line(goodput_account(read_metrics_log(log_.path()))).c_str());
      std::fflush(stdout);
    } catch (const std::exception& e) {
      log::warn(std::string("goodput: ") + e.what());
    }
  }

  // Collective. The evaluation and the saves a step asks for (keep-best's save after the step's own).
  void after_step(int64_t step, StepOutcome& outcome, bool eval_due) {
    if (eval_due || outcome.save_due) parallel_->wrapper().sync_buffers();  // rank 0's BatchNorm statistics everywhere
    std::optional<EvalResult> eval;
    if (eval_due) eval = evaluate_now();
    const bool new_best = eval && best_ && best_->offer(eval->accuracy, step);
    if (outcome.save_due) {
      const auto save_start = Clock::now();
      auto save_guard = watch_.watch("checkpoint save", StallWatch::Kind::kSave, step);
      ckpt_->save_if_due(outcome);
      watch_.observe(StallWatch::Kind::kSave, seconds_since(save_start));
      log_save(save_start);
    }
    if (new_best)
      best_->commit([&] {
        auto save_guard = watch_.watch("best checkpoint save", StallWatch::Kind::kSave, ckpt_->step());
        const auto save_start = Clock::now();
        ckpt_->save();
        log_save(save_start);
      });
  }

  // The save just made, logged once, with what the loop waited for since `since` as its blocked time: the save
  // call's wall time, which a wait for the previous background save (and a final save's write) is part of. Returns
  // whether it wrote a record (false: that save was logged already).
  bool log_save(Clock::time_point since) {
    SaveRecord r = save_record(ckpt_->last_save());
    if (r.step == ckpt_->step()) r.blocked_seconds = last_blocked_ = seconds_since(since);
    return log_.save(r);
  }

  // Collective. Forward and backward of this rank's share of the global batch in --grad-accum micro-batches
  // (only the last one reduces gradients: DDP no_sync before it), then the optimizer step at `lr`. Returns this
  // rank's mean loss.
  double forward_backward(const std::vector<int64_t>& indices, double lr) {
    const int64_t k = config_.grad_accum, micro = static_cast<int64_t>(indices.size()) / k;
    double loss_sum = 0;
    for (int64_t m = 0; m < k; ++m) {
      std::optional<DataParallel::NoSync> local;
      if (m + 1 < k) local.emplace(parallel_->wrapper().no_sync());
      auto [x, y] = batch_tensors(*train_set_, {indices.begin() + m * micro, indices.begin() + (m + 1) * micro});
      x = x.to(compute_.device, /*non_blocking=*/false);
      y = y.to(compute_.device);
      parallel_->wrapper().prepare_forward();
      torch::Tensor loss;
      {
        AutocastScope autocast(compute_);
        loss = batch_loss(train_set_->spec(), parallel_->forward(x), y);
      }
      if (k > 1) loss = loss / static_cast<double>(k);
      loss.backward();
      parallel_->wrapper().finish_backward();
      loss_sum += loss.item<double>();
    }
    if (config_.grad_clip > 0) {
      grad_norm_ = parallel_->wrapper().clip_grad_norm(config_.grad_clip);  // one agreed value: every rank skips alike
      if (!std::isfinite(*grad_norm_)) {
        skip_step();
        return loss_sum;
      }
    }
    parallel_->step(lr);
    return loss_sum;
  }

  // Collective (sharded: the gathering of parameters). A step whose gradient norm is not finite changes no
  // parameter and no optimizer state; its gradients go. The step still counts (the data moves on), as a
  // skipped step of PyTorch's GradScaler does.
  void skip_step() {
    ++skipped_steps_;
    if (root_)
      log::root_info("step " + std::to_string(ckpt_->step() + 1) +
                     ": the gradient norm is not finite; the optimizer step is skipped on every rank (" +
                     std::to_string(skipped_steps_) + " so far)");
    parallel_->skip_step();
  }

  // Collective. Each rank scores its share of the test set.
  EvalResult evaluate() {
    model_.module->eval();
    const ScoreSums s = score_distributed([this](const torch::Tensor& x) { return parallel_->forward(x); }, *test_set_,
                                          comm_, compute_);
    model_.module->train();
    const SampleSpec& spec = test_set_->spec();
    EvalResult r{spec.classification ? s.correct / s.rows : -1, s.loss / s.rows};
    if (spec.per_position) {
      r.perplexity = std::exp(r.loss);
      r.positions = static_cast<int64_t>(s.rows);
    }
    return r;
  }

  // Collective. evaluate(), named in the next checkpoint's meta and remembered with its step.
  EvalResult evaluate_for_meta() {
    const EvalResult r = evaluate();
    char acc[32];
    std::snprintf(acc, sizeof acc, "%.6f", r.accuracy);
    ckpt_->set_meta("eval_accuracy", acc);
    ckpt_->set_meta("eval_step", std::to_string(ckpt_->step()));
    last_eval_ = {ckpt_->step(), r};
    return r;
  }

  // Collective. A distributed evaluation during training: in the metrics log, on the console and in the next
  // checkpoint's meta.
  EvalResult evaluate_now() {
    const auto t0 = Clock::now();
    const EvalResult r = evaluate_for_meta();
    log_.eval(ckpt_->step(), ckpt_->data().epoch, r, seconds_since(t0));
    if (root_) {
      progress_->end_line();
      std::printf("%s\n", console::eval_line(ckpt_->step(), r, test_set_->size()).c_str());
      std::fflush(stdout);
    }
    return r;
  }

  // A signal (also one after the last step) saved the state; training asks to be requeued.
  TrainResult stopped() {
    result_.exit_code = ckpt_->exit_code();
    if (root_) {
      progress_->end_line();
      std::printf("%s\n", console::stopped_line(ckpt_->step(), ckpt_->last_checkpoint(), result_.exit_code).c_str());
      std::fflush(stdout);
    }
    log_.save(save_record(ckpt_->last_save()));
    log_.stop(ckpt_->step(), result_.exit_code, ckpt_->last_checkpoint());
    print_goodput();
    return result_;
  }

  // Collective. The background save in flight, the final save, the evaluation, the summary.
  // The final evaluation comes before the final save, so that checkpoint's meta names it; a periodic evaluation
  // at this very step is not repeated.
  void finish() {
    std::optional<EvalResult> final_eval;
    const auto eval_start = Clock::now();
    if (config_.evaluate) {
      parallel_->wrapper().sync_buffers();
      final_eval = last_eval_ && last_eval_->first == ckpt_->step() ? last_eval_->second : evaluate_for_meta();
      result_.test_accuracy = final_eval->accuracy;
      result_.test_loss = final_eval->loss;
    }
    const double eval_seconds = seconds_since(eval_start);
    parallel_->wrapper().sync_buffers();
    const auto save_start = Clock::now();
    {
      auto guard =
          watch_.watch(config_.final_checkpoint ? "final checkpoint save" : "wait for the background checkpoint save",
                       StallWatch::Kind::kSave, ckpt_->step());
      ckpt_->finish(config_.final_checkpoint);
    }
    result_.last_checkpoint = ckpt_->last_checkpoint();
    const bool new_save = log_save(save_start);  // else the wait for a background save goes to the end record
    log_.end(ckpt_->step(), ckpt_->data().epoch, result_.train_seconds, final_eval ? &*final_eval : nullptr,
             eval_seconds, new_save ? 0 : seconds_since(save_start));
    if (root_) print_summary(final_eval);
    print_goodput();
  }

  void print_summary(const std::optional<EvalResult>& final_eval) const {
    console::Summary s;
    s.step = ckpt_->step();
    s.epoch = ckpt_->data().epoch;
    s.epochs = config_.epochs;
    s.train_seconds = result_.train_seconds;
    s.world_size = comm_.size();
    s.evaluated = final_eval.has_value();
    if (final_eval) s.eval = *final_eval;
    s.test_samples = test_set_ ? test_set_->size() : 0;
    s.checkpoint = !result_.last_checkpoint.empty() ? result_.last_checkpoint : result_.resumed_from;
    s.resume_command = resume_command(this_process_facts(config_.command_line, comm_.size(), config_.local_size));
    s.program = config_.command_line.empty() ? "" : config_.command_line[0];
    std::printf("%s", console::summary(s).c_str());
    std::fflush(stdout);
  }

  const TrainConfig& config_;
  MpiComm& comm_;
  const bool root_;
  SignalScope signals_;
  StallWatch watch_;
  RunLog log_;
  TrainResult result_;
  std::unique_ptr<Dataset> train_set_, test_set_;
  TrainModel model_;
  Compute compute_;                          // --device, --precision
  std::unique_ptr<Comm> device_comm_;        // NcclComm with --device cuda
  std::unique_ptr<ParallelModel> parallel_;  // the model under --shard's wrapper, with its optimizer
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<KeepBest> best_;  // --keep-best
  LrSchedule schedule_;
  int64_t total_steps_ = 0;
  std::optional<double> grad_norm_;  // --grad-clip: the last step's agreed total norm (NaN: that step was skipped)
  int64_t skipped_steps_ = 0;        // steps skipped for a non-finite gradient norm by this process
  ResumeInfo info_;                  // what the resume found (resumed false: a fresh start)
  std::optional<std::pair<int64_t, EvalResult>> last_eval_;  // the step and result of the newest evaluation
  std::optional<AutoInterval> auto_;                         // --checkpoint-every-steps auto
  int64_t next_auto_save_ = 0;                               // with auto_: the step of the next save
  double last_blocked_ = 0;                                  // the newest save's blocked seconds (log_save)
};

}  // namespace

TrainResult run_training(const TrainConfig& config, MpiComm& comm) {
  return Trainer(config, comm).run();
}

}  // namespace h5ddp

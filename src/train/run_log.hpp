// What h5ddp-train tells about a run, in one place: the records of RUN_DIR/metrics.jsonl (MetricsLog, rank 0)
// and the console lines of rank 0 (resume, evaluation, stop, summary, next commands). The trainer decides what
// happened; this component words it. Torch-free, so its text is unit tested (tests/train/components_test.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "h5ddp/clock.hpp"
#include "train/metrics.hpp"

namespace h5ddp {

struct EvalResult {
  double accuracy = -1;    // fraction of the test set classified correctly (-1: regression, no accuracy)
  double loss = 0;         // mean cross-entropy (regression: mean squared error)
  double perplexity = -1;  // a language model (per-position labels): exp(loss), per token; else -1
  int64_t positions = 0;   // a language model: the positions (tokens) scored
};

// The save just made, as the metrics log records it (Checkpointer::last_save()).
struct SaveRecord {
  int64_t step = -1;
  std::string path;
  bool async = false;
  double blocked_seconds = 0;
  double seconds = 0;  // unknown (null) for an async save
  uint64_t bytes = 0;
};

// Rank 0's metrics.jsonl records. A disabled log (other ranks, --no-metrics) keeps the bookkeeping only.
class RunLog {
 public:
  using Clock = h5ddp::Clock;
  // `interval`: steps per "train" record (the mean loss over the interval).
  RunLog(const std::string& run_dir, bool enabled) : log_(run_dir, enabled) {}

  void set_interval(int64_t steps) { interval_ = steps > 0 ? steps : 1; }
  bool enabled() const { return log_.enabled(); }
  const std::string& path() const { return log_.path(); }
  // The steps after `step` are redone: their records go, so the log never holds two versions.
  void truncate_after(int64_t step) { log_.truncate_after(step); }
  // The first record of a process: both carry process_start (goodput.hpp process_start(), rank 0's).
  void start(int64_t step, int world_size);
  void resume(int64_t step, int world_size, const std::string& from, int saved_world_size, double load_seconds);
  // After optimizer step `step`: a "train" record every interval steps, at `flush` (the last step, and a step that
  // saves or evaluates: a resume then drops whole intervals, docs/METRICS.md) and when kHeartbeatSeconds have passed
  // since the last record (a killed run's end is known to within that). Each says the training seconds and steps it
  // covers. `grad_norm`: the step's total gradient norm with --grad-clip (NaN: the step was skipped); `skipped`:
  // steps skipped so far for a non-finite norm. `tokens_per_sample`: a language model's T (adds tokens_per_s).
  void train(int64_t step, int64_t epoch, double loss, double lr, int64_t global_batch, bool flush,
             std::optional<double> grad_norm = std::nullopt, int64_t skipped = 0, int64_t tokens_per_sample = 0);
  static constexpr double kHeartbeatSeconds = 10;
  // Time not to count as training (evaluations, saves) since the interval began.
  void pause(Clock::duration d) { interval_start_ += d; }
  void restart_interval() { interval_start_ = Clock::now(); }
  // `seconds`: the evaluation's wall time.
  void eval(int64_t step, int64_t epoch, const EvalResult& r, double seconds);
  // --checkpoint-every-steps auto: the interval chosen after a save (or at the start) and what it came from.
  void interval(int64_t step, int64_t steps, double save_seconds, double step_seconds, double mtbf_seconds);
  // Once per save (a second call for the same step does nothing: returns false).
  bool save(const SaveRecord& s);
  void stop(int64_t step, int exit_code, const std::string& checkpoint);
  // `eval_seconds`: the final evaluation's wall time (0 without one); `wait_seconds`: the end's wait for a background
  // save when it made no new save (whose record would carry it).
  void end(int64_t step, int64_t epoch, double train_seconds, const EvalResult* final_eval, double eval_seconds = 0,
           double wait_seconds = 0);
  void error(int64_t step, const std::string& message);

 private:
  MetricsLog log_;
  int64_t interval_ = 1;
  double loss_ = 0;
  int64_t steps_ = 0;
  double grad_norm_ = 0;  // sum over the interval's steps with a finite norm
  int64_t norms_ = 0;
  Clock::time_point interval_start_ = Clock::now();
  Clock::time_point last_record_ = Clock::now();
  int64_t saved_step_ = -1;
  void write(JsonRecord r);
};

// Console text of rank 0 (each without the final newline unless it is several lines).
namespace console {
std::string eval_line(int64_t step, const EvalResult& r, int64_t samples);
std::string resumed_line(const std::string& path, int64_t step, int64_t epoch, int64_t position, int saved_world_size,
                         int world_size, bool rng_exact);
std::string nothing_to_train(const std::string& path, int64_t step, int64_t epochs_done, int64_t max_steps,
                             int64_t epochs);
std::string stopped_line(int64_t step, const std::string& checkpoint, int exit_code);

struct Summary {
  int64_t step = 0, epoch = 0, epochs = 0;
  double train_seconds = 0;
  int world_size = 1;
  bool evaluated = false;
  EvalResult eval;
  int64_t test_samples = 0;
  std::string checkpoint;      // the newest checkpoint (or the one resumed from); "" none
  std::string resume_command;  // resume_command() of resume_hint.hpp
  std::string program;         // argv[0], for the h5ddp-ckpt beside it
};
// "trained to step ...", the test result, and the next commands (checkpoint, resume, inspect).
std::string summary(const Summary& s);
}  // namespace console

}  // namespace h5ddp

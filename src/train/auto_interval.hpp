// The checkpoint interval chosen from measured costs (--checkpoint-every-steps auto --mtbf DURATION, docs/GOODPUT.md):
// Young/Daly's optimum sqrt(2 x save cost x MTBF), in steps of the measured step time. Pure and torch-free: the
// trainer feeds it what it measured and agrees on the inputs across ranks.
#pragma once

#include <cstdint>
#include <string>

namespace h5ddp {

// /meta key of a checkpoint saved with --checkpoint-every-steps auto: the interval in steps in use when it was saved
// (docs/FORMAT.md "Meta"); a resume starts from it until its own first save is measured.
inline constexpr const char* kIntervalMeta = "checkpoint_every_steps";

// Local, pure. A duration in seconds: a number of seconds, or a number with a unit s, m, h or d ("90m", "1.5h",
// "2d"). Throws ConfigError "--<option> <text>: ..." for text that is not one, or not a finite number > 0.
double parse_duration(const std::string& text, const std::string& option);

// Local, pure. round(sqrt(2 x save_seconds x mtbf_seconds) / step_seconds), at least 1. A save that costs nothing
// measurable gives 1 (save every step); a step of no measurable time is taken as 1 microsecond.
int64_t young_daly_steps(double save_seconds, double mtbf_seconds, double step_seconds);

// The interval in use and the estimates behind it. Before any save is measured the interval is `first_steps`.
class AutoInterval {
 public:
  static constexpr int64_t kFirstSteps = 10;     // a fresh run's first interval: the first save measures the cost
  static constexpr double kSaveSmoothing = 0.5;  // weight of the newest save in the save-cost estimate

  explicit AutoInterval(double mtbf_seconds, int64_t first_steps = kFirstSteps);
  // Local: one optimizer step's seconds (evaluations and saves left out).
  void observe_step(double seconds);
  // Local: the mean step seconds observed since the last update (the previous estimate when none).
  double mean_step_seconds() const;
  // Local, pure given its inputs: re-estimates from a save's blocked seconds and the step seconds, both agreed
  // across ranks by the caller (the same on every rank, so every rank computes the same interval). Returns it.
  int64_t update(double save_seconds, double step_seconds);

  int64_t steps() const { return steps_; }
  double mtbf_seconds() const { return mtbf_; }
  double save_seconds() const { return save_; }  // the smoothed save cost (0: none measured yet)
  double step_seconds() const { return step_; }
  bool measured() const { return measured_; }

 private:
  double mtbf_;
  int64_t steps_;
  double save_ = 0, step_ = 0;
  bool measured_ = false;
  double step_sum_ = 0;
  int64_t step_count_ = 0;
};

}  // namespace h5ddp

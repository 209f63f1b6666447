// Learning-rate schedules as pure functions of the global step, so resuming needs only the step and
// the schedule's parameters (which the checkpoint records as SchedulerState).
#pragma once

#include <cstdint>
#include <string>

#include "h5ddp/train_state.hpp"

namespace h5ddp {

struct LrSchedule {
  std::string type = "constant";  // constant | step | cosine
  double base_lr = 1e-3;
  int64_t step_size = 1;  // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  int64_t total_steps = 1;   // cosine: lr reaches 0 at total_steps; the run's planned horizon
  int64_t warmup_steps = 0;  // linear warmup: the lr of step s < warmup_steps is scaled by (s + 1) / warmup_steps

  // True when the two schedules give the same lr at every step up to both horizons (the horizon may differ).
  bool same_shape(const LrSchedule& o) const;
  // "cosine, lr 0.002, horizon 12 steps" for messages.
  std::string describe() const;

  // Learning rate for the optimizer step that follows `step` completed steps.
  double lr_at(int64_t step) const;
  // The schedule's parameters and `step` as recorded in a checkpoint.
  SchedulerState to_state(int64_t step) const;
  // Inverse of to_state; throws CheckpointError on an unknown type or missing value (warmup_steps may be absent:
  // files written before it existed had none).
  static LrSchedule from_state(const SchedulerState& s);
};

// Local, pure. The schedule a resume continues: the checkpoint's `saved` one (its shape, and for cosine its
// horizon, so raising --epochs does not change the lrs already planned) when it has the shape this run plans;
// `planned` itself when the file records none (an import, a library writer). Throws ConfigError, naming `path`
// and --replan-lr-schedule, when the shapes differ; CheckpointError when `saved` cannot be read. `note`: set when
// a kept cosine horizon differs from the planned one (the line to show the user).
// Local, pure. The schedule h5ddp-train's options ask for over `total_steps` (--lr-step-size 0: one epoch).
LrSchedule schedule_for(const std::string& type, double base_lr, int64_t step_size, double gamma, int64_t warmup_steps,
                        int64_t steps_per_epoch, int64_t total_steps);

LrSchedule continued_schedule(const SchedulerState& saved, const LrSchedule& planned, const std::string& path,
                              int64_t step, std::string* note);

}  // namespace h5ddp

#include "train/lr_schedule.hpp"

#include <cmath>

#include "h5ddp/error.hpp"

namespace h5ddp {

namespace {
double base_schedule(const LrSchedule& s, int64_t step);
}  // namespace

double LrSchedule::lr_at(int64_t step) const {
  const double lr = base_schedule(*this, step);
  if (warmup_steps > 0 && step < warmup_steps)
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  return lr;
}

bool LrSchedule::same_shape(const LrSchedule& o) const {
  return type == o.type && base_lr == o.base_lr && warmup_steps == o.warmup_steps &&
         (type != "step" || (step_size == o.step_size && gamma == o.gamma));
}

std::string LrSchedule::describe() const {
  std::string s = type + ", lr " + std::to_string(base_lr);
  if (type == "step") s += ", x" + std::to_string(gamma) + " every " + std::to_string(step_size) + " steps";
  if (warmup_steps > 0) s += ", warmup " + std::to_string(warmup_steps) + " steps";
  return s + ", horizon " + std::to_string(total_steps) + " steps";
}

namespace {
double base_schedule(const LrSchedule& s, int64_t step) {
  const auto& type = s.type;
  const double base_lr = s.base_lr, gamma = s.gamma;
  const int64_t step_size = s.step_size, total_steps = s.total_steps;
  if (type == "step") return base_lr * std::pow(gamma, static_cast<double>(step / std::max<int64_t>(step_size, 1)));
  if (type == "cosine") {
    const double t = std::min(1.0, static_cast<double>(step) / static_cast<double>(std::max<int64_t>(total_steps, 1)));
    return 0.5 * base_lr * (1.0 + std::cos(M_PI * t));
  }
  return base_lr;
}
}  // namespace

SchedulerState LrSchedule::to_state(int64_t step) const {
  SchedulerState s;
  s.type = type;
  s.values = {{"base_lr", base_lr},
              {"step_size", static_cast<double>(step_size)},
              {"gamma", gamma},
              {"total_steps", static_cast<double>(total_steps)},
              {"warmup_steps", static_cast<double>(warmup_steps)},
              {"last_epoch", static_cast<double>(step)},  // PyTorch's name for the scheduler's step count
              {"lr", lr_at(step)}};
  return s;
}

LrSchedule LrSchedule::from_state(const SchedulerState& s) {
  if (s.type != "constant" && s.type != "step" && s.type != "cosine")
    throw CheckpointError("unknown learning-rate schedule '" + s.type + "' in checkpoint");
  // Values a schedule's type needs must be there; the others (a writer of another kind may omit them) default.
  auto get = [&](const char* k, bool needed, double fallback) {
    auto it = s.values.find(k);
    if (it != s.values.end()) return it->second;
    if (needed) throw CheckpointError("the " + s.type + " learning-rate schedule in checkpoint lacks '" + k + "'");
    return fallback;
  };
  LrSchedule l;
  l.type = s.type;
  l.base_lr = get("base_lr", true, 0);
  l.step_size = static_cast<int64_t>(get("step_size", s.type == "step", 1));
  l.gamma = get("gamma", s.type == "step", 0.1);
  l.total_steps = static_cast<int64_t>(get("total_steps", s.type == "cosine", 1));
  l.warmup_steps = static_cast<int64_t>(get("warmup_steps", false, 0));  // absent in files written before it existed
  return l;
}

LrSchedule continued_schedule(const SchedulerState& s, const LrSchedule& planned, const std::string& path, int64_t step,
                              std::string* note) {
  if (s.type.empty() || s.type == "none") return planned;
  LrSchedule saved = with_context("reading the lr schedule of " + path, [&] { return LrSchedule::from_state(s); });
  if (!saved.same_shape(planned))
    throw ConfigError("the checkpoint " + path + " continues the lr schedule " + saved.describe() +
                      "; this run's options ask for " + planned.describe() +
                      ": pass --replan-lr-schedule to change it from step " + std::to_string(step));
  if (saved.type != "cosine") {  // only cosine depends on the horizon
    saved.total_steps = planned.total_steps;
  } else if (saved.total_steps != planned.total_steps && note) {
    *note = "note: the lr schedule keeps the checkpoint's horizon of " + std::to_string(saved.total_steps) +
            " steps (this run plans " + std::to_string(planned.total_steps) +
            (planned.total_steps > saved.total_steps ? "; steps past the horizon run at the schedule's end value, lr 0"
                                                     : "") +
            "); --replan-lr-schedule plans it over this run";
  }
  return saved;
}

LrSchedule schedule_for(const std::string& type, double base_lr, int64_t step_size, double gamma, int64_t warmup_steps,
                        int64_t steps_per_epoch, int64_t total_steps) {
  LrSchedule s;
  s.type = type;
  s.base_lr = base_lr;
  s.step_size = step_size > 0 ? step_size : steps_per_epoch;
  s.gamma = gamma;
  s.total_steps = total_steps;
  s.warmup_steps = warmup_steps;
  return s;
}

}  // namespace h5ddp

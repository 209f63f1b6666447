#include "train/lr_schedule.hpp"

#include <cmath>

#include "h5ddp/error.hpp"

namespace h5ddp {

double LrSchedule::lr_at(int64_t step) const {
  if (type == "step") return base_lr * std::pow(gamma, static_cast<double>(step / std::max<int64_t>(step_size, 1)));
  if (type == "cosine") {
    const double t = std::min(1.0, static_cast<double>(step) / static_cast<double>(std::max<int64_t>(total_steps, 1)));
    return 0.5 * base_lr * (1.0 + std::cos(M_PI * t));
  }
  return base_lr;
}

SchedulerState LrSchedule::to_state(int64_t step) const {
  SchedulerState s;
  s.type = type;
  s.values = {{"base_lr", base_lr},
              {"step_size", static_cast<double>(step_size)},
              {"gamma", gamma},
              {"total_steps", static_cast<double>(total_steps)},
              {"last_epoch", static_cast<double>(step)},  // PyTorch's name for the scheduler's step count
              {"lr", lr_at(step)}};
  return s;
}

LrSchedule LrSchedule::from_state(const SchedulerState& s) {
  if (s.type != "constant" && s.type != "step" && s.type != "cosine")
    throw CheckpointError("unknown learning-rate schedule '" + s.type + "' in checkpoint");
  auto get = [&](const char* k) {
    auto it = s.values.find(k);
    if (it == s.values.end()) throw CheckpointError(std::string("scheduler state lacks '") + k + "'");
    return it->second;
  };
  LrSchedule l;
  l.type = s.type;
  l.base_lr = get("base_lr");
  l.step_size = static_cast<int64_t>(get("step_size"));
  l.gamma = get("gamma");
  l.total_steps = static_cast<int64_t>(get("total_steps"));
  return l;
}

}  // namespace h5ddp

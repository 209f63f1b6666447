#include "train/stall_watch.hpp"

#include <algorithm>
#include <cstdlib>

namespace h5ddp {

StallWatch::StallWatch(double configured)
    : auto_(configured < 0),
      configured_(configured),
      step_floor_(floor_from_env(&env_floor_)),
      step_limit_(step_floor_, 20),
      save_limit_(env_floor_ ? 3 * step_floor_ : kAutoWatchdogSaveFloor, 10),
      watchdog_(auto_ ? step_floor_ : configured) {}

double StallWatch::floor_from_env(bool* from_env) {
  const char* hooks = std::getenv("H5DDP_TEST_HOOKS");
  const char* env = hooks && std::string(hooks) == "1" ? std::getenv("H5DDP_WATCHDOG_FLOOR_SECONDS") : nullptr;
  *from_env = env != nullptr;
  return env ? std::max(0.1, std::atof(env)) : kAutoWatchdogStepFloor;
}

double StallWatch::limit(Kind kind) const {
  if (!watchdog_.enabled()) return 0;
  if (auto_) return (kind == Kind::kStep ? step_limit_ : save_limit_).seconds();
  return (kind == Kind::kStep ? 1 : 10) * configured_;
}

Watchdog::Guard StallWatch::watch(const std::string& what, Kind kind, int64_t step) {
  if (!watchdog_.enabled()) return Watchdog::Guard();
  return watchdog_.guard(what + " at step " + std::to_string(step + 1), limit(kind));
}

void StallWatch::observe(Kind kind, double seconds) {
  (kind == Kind::kStep ? step_limit_ : save_limit_).observe(seconds);
}

}  // namespace h5ddp

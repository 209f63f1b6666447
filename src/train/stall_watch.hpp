// --watchdog-seconds for h5ddp-train: a stalled step or save aborts the job with a message naming host, rank and
// operation instead of hanging it. auto (the default): 20x the slowest step and 10x the slowest save this process
// has seen, at least 300 s and 900 s; T: T per step, 10 T per save; 0: off. Tests lower the floors with
// H5DDP_WATCHDOG_FLOOR_SECONDS (the step floor; the save floor is 3x it), a test-only hook armed only with
// H5DDP_TEST_HOOKS=1, so a stray variable cannot abort a real run.
#pragma once

#include <cstdint>
#include <string>

#include "h5ddp/watchdog.hpp"

namespace h5ddp {

class StallWatch {
 public:
  enum class Kind { kStep, kSave };

  // configured < 0: auto; 0: off; T > 0: T seconds per step.
  explicit StallWatch(double configured);

  // Local. A guard over one operation ("checkpoint save at step 12"), released when it ends in time.
  Watchdog::Guard watch(const std::string& what, Kind kind, int64_t step);
  // Local. How long the last such operation took (auto limits grow with the slowest).
  void observe(Kind kind, double seconds);
  // The limit a watch() of this kind gets now (0: off).
  double limit(Kind kind) const;

 private:
  static double floor_from_env(bool* from_env);

  bool auto_;
  double configured_;
  bool env_floor_ = false;
  double step_floor_;
  AutoLimit step_limit_, save_limit_;
  Watchdog watchdog_;
};

}  // namespace h5ddp

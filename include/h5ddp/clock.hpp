// The one clock of the library's timings and time triggers (save every T seconds, stall watch, progress, phase
// timelines): monotonic, so a wall-clock adjustment during a run never fires or delays anything.
#pragma once

#include <chrono>

namespace h5ddp {

using Clock = std::chrono::steady_clock;

// Seconds from t to now.
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace h5ddp

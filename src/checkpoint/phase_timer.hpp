// The "phase=seconds ..." timelines of saves and loads (private to h5ddp_checkpoint), logged at debug level.
#pragma once

#include <chrono>
#include <string>

#include "h5ddp/clock.hpp"

namespace h5ddp::ckpt {

// "phase=seconds ..." of a save or load, for H5DDP_LOG_LEVEL=debug.
class PhaseTimer {
 public:
  PhaseTimer() : start_(Clock::now()), last_(start_) {}
  // Time since the previous mark (or construction), under `phase`.
  void mark(const char* phase) {
    const auto now = Clock::now();
    timeline_ += std::string(" ") + phase + "=" + std::to_string(std::chrono::duration<double>(now - last_).count());
    last_ = now;
  }
  const std::string& timeline() const { return timeline_; }
  double total_seconds() const { return seconds_since(start_); }

 private:
  Clock::time_point start_, last_;
  std::string timeline_;
};

}  // namespace h5ddp::ckpt

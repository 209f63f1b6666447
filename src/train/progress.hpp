// Rank 0's progress display of h5ddp-train: one line rewritten with '\r' on a terminal, or a line every N
// steps (under mpirun, in logs): step/total, epoch, mean loss since the last line, samples/s, elapsed, ETA.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "train/config.hpp"

namespace h5ddp {

// "mm:ss", "h:mm:ss" from 1 hour on; "--:--" for a negative or non-finite time (no estimate yet).
std::string format_duration(double seconds);

class Progress {
 public:
  // Disabled (not rank 0): every call does nothing. mode auto | tty | lines; log_every <= 0: about 20 lines a run.
  Progress(bool enabled, ProgressMode mode, int64_t total_steps, int64_t log_every, std::FILE* out = stdout);

  // Open MPI hands its ranks a pseudo-terminal even when mpirun's own output is a pipe or a file, so under
  // mpirun "auto" means lines; --progress tty (e.g. from a launch script that saw a terminal) forces it.
  static bool use_tty(ProgressMode mode);

  void start(int64_t step);
  // After optimizer step `step` with that step's mean loss over ranks; `last`: the run's last step.
  void update(int64_t step, int64_t epoch, int64_t epochs, double loss, int64_t global_batch, bool last);
  // Ends a '\r' line before other output (an evaluation's line, the summary).
  void end_line();

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_, tty_;
  int64_t total_, every_;
  std::FILE* out_;
  int64_t start_step_ = 0;
  Clock::time_point start_, last_print_;
  double loss_sum_ = 0;
  int64_t loss_n_ = 0;
};

}  // namespace h5ddp

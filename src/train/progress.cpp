#include "train/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "h5ddp/clock.hpp"

namespace h5ddp {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

Progress::Progress(bool enabled, ProgressMode mode, int64_t total_steps, int64_t log_every, std::FILE* out)
    : enabled_(enabled),
      tty_(enabled && use_tty(mode)),
      total_(total_steps),
      every_(log_every > 0 ? log_every : std::max<int64_t>(1, total_steps / 20)),
      out_(out) {}

bool Progress::use_tty(ProgressMode mode) {
  if (mode != ProgressMode::kAuto) return mode == ProgressMode::kTty;
  return ::isatty(STDOUT_FILENO) && !std::getenv("OMPI_COMM_WORLD_SIZE");
}

void Progress::start(int64_t step) {
  start_step_ = step;
  start_ = last_print_ = Clock::now();
}

void Progress::update(int64_t step, int64_t epoch, int64_t epochs, double loss, int64_t global_batch, bool last) {
  if (!enabled_) return;
  loss_sum_ += loss;
  ++loss_n_;
  const bool due = tty_ ? (seconds_since(last_print_) > 0.25 || last) : (step % every_ == 0 || last);
  if (!due) return;
  const double el = seconds_since(start_);
  const double sps = el > 0 ? static_cast<double>(step - start_step_) / el : 0;
  const double eta = sps > 0 ? static_cast<double>(total_ - step) / sps : NAN;
  std::fprintf(out_, "%sstep %lld/%lld  epoch %lld/%lld  loss %.4f  %.0f samples/s  elapsed %s  ETA %s%s",
               tty_ ? "\r" : "", static_cast<long long>(step), static_cast<long long>(total_),
               static_cast<long long>(std::min(epoch + 1, epochs)), static_cast<long long>(epochs),
               loss_sum_ / static_cast<double>(std::max<int64_t>(loss_n_, 1)), sps * static_cast<double>(global_batch),
               format_duration(el).c_str(), format_duration(eta).c_str(), tty_ ? "   " : "\n");
  if (tty_ && last) std::fprintf(out_, "\n");
  std::fflush(out_);
  loss_sum_ = 0;
  loss_n_ = 0;
  last_print_ = Clock::now();
}

void Progress::end_line() {
  if (tty_) {
    std::fprintf(out_, "\n");
    std::fflush(out_);
  }
}

}  // namespace h5ddp

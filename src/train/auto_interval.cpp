#include "train/auto_interval.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "h5ddp/error.hpp"

namespace h5ddp {

double parse_duration(const std::string& text, const std::string& option) {
  const std::string expected =
      "must be a duration > 0: seconds, or a number with a unit s, m, h or d (e.g. 3600, 90m, 1.5h, 2d)";
  const char* begin = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  const std::string unit = end != begin ? std::string(end) : std::string();
  double scale = 0;
  if (unit.empty() || unit == "s")
    scale = 1;
  else if (unit == "m")
    scale = 60;
  else if (unit == "h")
    scale = 3600;
  else if (unit == "d")
    scale = 86400;
  const bool number = end != begin && !std::isspace(static_cast<unsigned char>(text[0]));
  if (!number || scale == 0 || !std::isfinite(v) || v <= 0 || !std::isfinite(v * scale))
    throw ConfigError("--" + option + " " + text + ": " + expected);
  return v * scale;
}

int64_t young_daly_steps(double save_seconds, double mtbf_seconds, double step_seconds) {
  const double step = std::max(step_seconds, 1e-6);
  const double interval = std::sqrt(2.0 * std::max(save_seconds, 0.0) * mtbf_seconds) / step;
  if (!std::isfinite(interval)) return 1;
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(std::min(interval, 1e15))));
}

AutoInterval::AutoInterval(double mtbf_seconds, int64_t first_steps)
    : mtbf_(mtbf_seconds), steps_(std::max<int64_t>(1, first_steps)) {}

void AutoInterval::observe_step(double seconds) {
  step_sum_ += seconds;
  ++step_count_;
}

double AutoInterval::mean_step_seconds() const {
  return step_count_ > 0 ? step_sum_ / static_cast<double>(step_count_) : step_;
}

int64_t AutoInterval::update(double save_seconds, double step_seconds) {
  save_ = measured_ ? kSaveSmoothing * save_seconds + (1 - kSaveSmoothing) * save_ : save_seconds;
  if (step_seconds > 0) step_ = step_seconds;
  measured_ = true;
  step_sum_ = 0;
  step_count_ = 0;
  steps_ = young_daly_steps(save_, mtbf_, step_);
  return steps_;
}

}  // namespace h5ddp

#include "h5ddp/policy.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

namespace h5ddp {

bool SavePolicy::step_due(int64_t step) const {
  return every_steps_ > 0 && step % every_steps_ == 0;
}

bool SavePolicy::time_due(double seconds_since_last_save) const {
  return every_seconds_ > 0 && seconds_since_last_save >= every_seconds_;
}

SaveDecision SavePolicy::decide(int64_t step, double seconds_since_last_save, bool stop_signal) const {
  return decide_agreed(step, time_due(seconds_since_last_save), stop_signal);
}

SaveDecision SavePolicy::decide_agreed(int64_t step, bool time_due_on_any_rank, bool stop_signal_on_any_rank) const {
  SaveDecision d;
  d.step = step_due(step);
  d.time = time_due_on_any_rank;
  d.signal = stop_signal_on_any_rank;
  return d;
}

bool KeepPolicy::needs_values() const {
  return keep_last > 0 && keep_best > 0 && !best_metric.empty();
}

std::vector<std::string> KeepPolicy::files_to_delete(const std::vector<CheckpointEntry>& entries,
                                                     const std::vector<std::string>& pinned) const {
  if (keep_last <= 0) return {};
  std::vector<const CheckpointEntry*> by_step;
  for (const auto& e : entries) by_step.push_back(&e);
  std::sort(by_step.begin(), by_step.end(), [](const CheckpointEntry* a, const CheckpointEntry* b) {
    return a->step != b->step ? a->step > b->step : a->file > b->file;
  });

  std::set<std::string> best;
  if (needs_values()) {
    std::vector<const CheckpointEntry*> scored;
    for (const auto* e : by_step)
      if (e->value && !std::isnan(*e->value)) scored.push_back(e);
    const bool higher = best_order == MetricOrder::kHigherIsBetter;
    std::stable_sort(scored.begin(), scored.end(), [&](const CheckpointEntry* a, const CheckpointEntry* b) {
      if (*a->value != *b->value) return higher ? *a->value > *b->value : *a->value < *b->value;
      return a->step != b->step ? a->step < b->step : a->file < b->file;  // ties: the earlier file
    });
    for (size_t i = 0; i < scored.size() && static_cast<int>(i) < keep_best; ++i) best.insert(scored[i]->file);
  }

  auto named = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  std::vector<std::string> out;
  for (size_t i = 0; i < by_step.size(); ++i) {
    const CheckpointEntry& e = *by_step[i];
    const bool keep = static_cast<int>(i) < keep_last || named(pinned, e.file) ||
                      (keep_every > 0 && e.step % keep_every == 0) || named(keep_files, e.file) || best.count(e.file);
    if (!keep) out.push_back(e.file);
  }
  return out;
}

std::optional<double> parse_metric(const std::string& text) {
  const char* begin = text.c_str();
  while (std::isspace(static_cast<unsigned char>(*begin))) ++begin;
  if (*begin == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  while (std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (*end != '\0' || std::isnan(v)) return std::nullopt;
  return v;  // an out-of-range value is +-HUGE_VAL (or a denormal): still ordered correctly
}

}  // namespace h5ddp

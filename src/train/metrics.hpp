// The run's story in RUN_DIR/metrics.jsonl (docs/METRICS.md): one JSON object per line, appended by rank 0
// across restarts. A resume first drops the records of the steps it is about to redo (those after the step it
// resumed from), so the file never holds two versions of a step.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace h5ddp {

// One JSON object built field by field ({"event":"train","step":5,...}); numbers, strings, booleans, null.
class JsonRecord {
 public:
  explicit JsonRecord(const std::string& event);
  JsonRecord& add(const std::string& key, double v);
  JsonRecord& add(const std::string& key, int64_t v);
  JsonRecord& add(const std::string& key, int v) { return add(key, static_cast<int64_t>(v)); }
  JsonRecord& add(const std::string& key, bool v);
  JsonRecord& add(const std::string& key, const std::string& v);
  JsonRecord& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonRecord& add_null(const std::string& key);
  std::string line() const { return text_ + "}"; }

 private:
  std::string text_;
};

// JSON string literal of `s` (quotes, backslashes and control characters escaped).
std::string json_quote(const std::string& s);

class MetricsLog {
 public:
  // Local. Only an enabled log (rank 0 with --metrics) touches the file.
  MetricsLog(const std::string& run_dir, bool enabled);
  const std::string& path() const { return path_; }
  bool enabled() const { return enabled_; }
  // Drops every record whose "step" is greater than `step` (the steps a resume redoes); the file is
  // rewritten to a temporary and renamed over, so a kill leaves either version whole.
  void truncate_after(int64_t step);
  // Appends one record (adds "time", seconds since the epoch) and flushes it.
  void write(JsonRecord record);

 private:
  std::string path_;
  bool enabled_;
};

// The "step" field of a metrics line, or -1 when it has none (tests and truncate_after use it).
int64_t metrics_step_of(const std::string& line);

}  // namespace h5ddp

// The run's story in RUN_DIR/metrics.jsonl (docs/METRICS.md): one JSON object per line, appended by rank 0
// across restarts. A resume first drops the records of the steps it is about to redo (those after the step it
// resumed from), so the file never holds two versions of a step.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
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

// One metrics line read back: a flat JSON object (numbers, strings, booleans, null; what JsonRecord writes).
class MetricsRecord {
 public:
  // Local, pure. Nothing for a line that is not a flat JSON object.
  static std::optional<MetricsRecord> parse(const std::string& line);
  std::string event() const { return text("event"); }
  bool has(const std::string& key) const { return fields_.count(key) != 0; }
  // The number under `key`; nothing when absent, null or not a number.
  std::optional<double> number(const std::string& key) const;
  // number(key), or `otherwise`.
  double number_or(const std::string& key, double otherwise) const { return number(key).value_or(otherwise); }
  // The string under `key`; "" when absent or not a string.
  std::string text(const std::string& key) const;

 private:
  struct Value {
    bool is_number = false, is_string = false;
    double number = 0;
    std::string text;
  };
  std::map<std::string, Value> fields_;
};

class MetricsLog {
 public:
  // Local. Only an enabled log (rank 0 with --metrics) touches the file.
  MetricsLog(const std::string& run_dir, bool enabled);
  const std::string& path() const { return path_; }
  bool enabled() const { return enabled_; }
  // Drops every record whose "step" is greater than `step` (the steps a resume redoes) and puts one "lost" record
  // in their place that sums them up (lost_record()); the file is rewritten to a temporary and renamed over, so a
  // kill leaves either version whole.
  void truncate_after(int64_t step);
  // Appends one record (adds "time", seconds since the epoch) and flushes it.
  void write(JsonRecord record);

 private:
  std::string path_;
  bool enabled_;
};

// The "step" field of a metrics line, or -1 when it has none (tests and truncate_after use it).
int64_t metrics_step_of(const std::string& line);

// Local, pure. The "lost" record that stands for `dropped` (records of steps after `resumed_step`, which a resume
// redoes): the range of steps, their training seconds, the saves' blocked seconds, the evaluations' seconds, and
// "time" = the newest dropped record's (the killed run's last known time). "" when `dropped` is empty.
std::string lost_record(int64_t resumed_step, const std::vector<std::string>& dropped);

}  // namespace h5ddp

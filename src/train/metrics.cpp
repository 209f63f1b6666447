#include "train/metrics.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "h5ddp/log.hpp"

namespace h5ddp {

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

JsonRecord::JsonRecord(const std::string& event) : text_("{\"event\":" + json_quote(event)) {}

JsonRecord& JsonRecord::add(const std::string& key, double v) {
  if (!std::isfinite(v)) return add_null(key);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  text_ += "," + json_quote(key) + ":" + buf;
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, int64_t v) {
  text_ += "," + json_quote(key) + ":" + std::to_string(v);
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, bool v) {
  text_ += "," + json_quote(key) + ":" + (v ? "true" : "false");
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, const std::string& v) {
  text_ += "," + json_quote(key) + ":" + json_quote(v);
  return *this;
}

JsonRecord& JsonRecord::add_null(const std::string& key) {
  text_ += "," + json_quote(key) + ":null";
  return *this;
}

int64_t metrics_step_of(const std::string& line) {
  const std::string key = "\"step\":";
  const size_t at = line.find(key);
  if (at == std::string::npos) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(line.c_str() + at + key.size(), &end, 10);
  return end == line.c_str() + at + key.size() ? -1 : v;
}

MetricsLog::MetricsLog(const std::string& run_dir, bool enabled)
    : path_(run_dir + "/metrics.jsonl"), enabled_(enabled) {}

void MetricsLog::truncate_after(int64_t step) {
  if (!enabled_) return;
  std::ifstream in(path_);
  if (!in) return;
  std::vector<std::string> kept;
  size_t dropped = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (metrics_step_of(line) > step)
      ++dropped;
    else
      kept.push_back(line);
  }
  in.close();
  if (dropped == 0) return;
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& l : kept) out << l << '\n';
    if (!out.flush()) {
      log::warn("metrics: cannot rewrite " + path_ + "; records past step " + std::to_string(step) + " remain");
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) log::warn("metrics: cannot replace " + path_ + ": " + ec.message());
}

void MetricsLog::write(JsonRecord record) {
  if (!enabled_) return;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  record.add("time", now);
  std::ofstream out(path_, std::ios::app);
  out << record.line() << '\n';
  out.flush();
  if (!out) log::warn("metrics: cannot append to " + path_);
}

}  // namespace h5ddp

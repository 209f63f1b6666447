#include "train/metrics.hpp"

#include <algorithm>
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

namespace {

// A reader of the flat JSON objects JsonRecord writes: one pass over `s`, failing (false) on anything else.
class FlatJsonReader {
 public:
  explicit FlatJsonReader(const std::string& s) : s_(s) {}
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ >= s_.size() || s_[i_] != c) return false;
    ++i_;
    return true;
  }
  char peek() {
    skip_space();
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  bool at_end() {
    skip_space();
    return i_ == s_.size();
  }
  bool string(std::string& out) {
    if (!eat('"')) return false;
    out.clear();
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      c = s_[i_++];
      if (c == 'u') {
        if (i_ + 4 > s_.size()) return false;
        append_utf8(out, std::strtoul(s_.substr(i_, 4).c_str(), nullptr, 16));
        i_ += 4;
        continue;
      }
      const std::string from = "\"\\/bfnrt", to = "\"\\/\b\f\n\r\t";
      const size_t k = from.find(c);
      if (k == std::string::npos) return false;
      out += to[k];
    }
    return eat('"');
  }
  // A number, true, false or null: the literal's text up to the next ',' or '}'.
  bool literal(std::string& out) {
    skip_space();
    const size_t end = s_.find_first_of(",}", i_);
    if (end == std::string::npos || end == i_) return false;
    out = s_.substr(i_, end - i_);
    while (!out.empty() && (out.back() == ' ' || out.back() == '\t')) out.pop_back();
    i_ = end;
    return true;
  }

 private:
  static void append_utf8(std::string& out, unsigned long cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace

std::optional<MetricsRecord> MetricsRecord::parse(const std::string& line) {
  FlatJsonReader in(line);
  MetricsRecord r;
  if (!in.eat('{')) return std::nullopt;
  if (in.eat('}')) return in.at_end() ? std::optional<MetricsRecord>(r) : std::nullopt;
  do {
    std::string key;
    Value v;
    if (!in.string(key) || !in.eat(':')) return std::nullopt;
    if (in.peek() == '"') {
      if (!in.string(v.text)) return std::nullopt;
      v.is_string = true;
    } else {
      std::string lit;
      if (!in.literal(lit)) return std::nullopt;
      char* end = nullptr;
      v.number = std::strtod(lit.c_str(), &end);
      v.is_number = end == lit.c_str() + lit.size();
      if (!v.is_number && lit != "null" && lit != "true" && lit != "false") return std::nullopt;
      if (lit == "true") v.number = 1;
    }
    r.fields_[key] = v;
  } while (in.eat(','));
  if (!in.eat('}') || !in.at_end()) return std::nullopt;
  return r;
}

std::optional<double> MetricsRecord::number(const std::string& key) const {
  const auto it = fields_.find(key);
  if (it == fields_.end() || !it->second.is_number) return std::nullopt;
  return it->second.number;
}

std::string MetricsRecord::text(const std::string& key) const {
  const auto it = fields_.find(key);
  return it == fields_.end() || !it->second.is_string ? std::string() : it->second.text;
}

std::string lost_record(int64_t resumed_step, const std::vector<std::string>& dropped) {
  if (dropped.empty()) return "";
  int64_t last_step = resumed_step;
  double train = 0, blocked = 0, eval = 0, time = 0;
  for (const auto& line : dropped) {
    const auto r = MetricsRecord::parse(line);
    if (!r) continue;
    last_step = std::max<int64_t>(last_step, static_cast<int64_t>(r->number_or("step", 0)));
    time = std::max(time, r->number_or("time", 0));
    if (r->event() == "train") train += r->number_or("seconds", 0);
    if (r->event() == "save") blocked += r->number_or("blocked_seconds", 0);
    if (r->event() == "eval") eval += r->number_or("seconds", 0);
  }
  // No "step" field: a later resume from an earlier step keeps this record (it sums up steps already redone).
  JsonRecord lost("lost");
  lost.add("first_step", resumed_step + 1)
      .add("last_step", last_step)
      .add("train_seconds", train)
      .add("blocked_seconds", blocked)
      .add("eval_seconds", eval)
      .add("records", static_cast<int64_t>(dropped.size()));
  return lost.add("time", time).line();
}

MetricsLog::MetricsLog(const std::string& run_dir, bool enabled)
    : path_(run_dir + "/metrics.jsonl"), enabled_(enabled) {}

void MetricsLog::truncate_after(int64_t step) {
  if (!enabled_) return;
  std::ifstream in(path_);
  if (!in) return;
  std::vector<std::string> kept, dropped;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (metrics_step_of(line) > step)
      dropped.push_back(line);
    else
      kept.push_back(line);
  }
  in.close();
  if (dropped.empty()) return;
  kept.push_back(lost_record(step, dropped));
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

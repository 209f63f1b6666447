#include "train/goodput.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

double now_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

SegmentAccount open_segment(const MetricsRecord& r, int index) {
  SegmentAccount s;
  s.index = index;
  s.resumed = r.event() == "resume";
  s.first_step = s.last_step = static_cast<int64_t>(r.number_or("step", 0));
  s.world_size = static_cast<int>(r.number_or("world_size", 0));
  s.load = r.number_or("load_seconds", 0);
  const double time = r.number_or("time", 0);
  s.process_start_known = r.number("process_start").has_value();
  s.process_start = r.number_or("process_start", time);
  s.startup = time - s.process_start;
  s.last_time = time;
  return s;
}

// A "lost" record sums up the records a resume dropped: they belong to the segment they came from.
void add_lost(SegmentAccount& s, const MetricsRecord& r) {
  const auto first = static_cast<int64_t>(r.number_or("first_step", 0));
  const auto last = static_cast<int64_t>(r.number_or("last_step", 0));
  s.train_lost += r.number_or("train_seconds", 0);
  s.blocked += r.number_or("blocked_seconds", 0);
  s.eval += r.number_or("eval_seconds", 0);
  if (last >= first) {
    s.lost_first = s.lost_steps > 0 ? std::min(s.lost_first, first) : first;
    s.lost_last = std::max(s.lost_last, last);
    s.lost_steps += last - first + 1;
  }
}

void add_record(SegmentAccount& s, const MetricsRecord& r) {
  const std::string e = r.event();
  s.last_time = std::max(s.last_time, r.number_or("time", s.last_time));
  if (e == "train") {
    s.train_kept += r.number_or("seconds", 0);
    s.last_step = std::max(s.last_step, static_cast<int64_t>(r.number_or("step", 0)));
  } else if (e == "save") {
    s.blocked += r.number_or("blocked_seconds", 0);
  } else if (e == "eval") {
    s.eval += r.number_or("seconds", 0);
  } else if (e == "end") {
    s.eval += r.number_or("eval_seconds", 0);
    s.blocked += r.number_or("wait_seconds", 0);
    s.ended = "end";
  } else if (e == "stop") {
    s.ended = format("stop (exit %d)", static_cast<int>(r.number_or("exit_code", 0)));
  } else if (e == "error") {
    s.ended = "error";
  } else if (e == "lost") {
    add_lost(s, r);
  }
}

void close_segment(SegmentAccount& s, bool last) {
  if (s.ended.empty()) s.ended = last ? "running or killed" : "killed";
  s.wall = s.last_time - s.process_start;
  s.other = s.wall - (s.startup + s.train_kept + s.train_lost + s.blocked + s.eval);
}

void add_totals(GoodputAccount& a) {
  for (const auto& s : a.segments) {
    a.wall += s.wall;
    a.startup += s.startup;
    a.train_kept += s.train_kept;
    a.train_lost += s.train_lost;
    a.blocked += s.blocked;
    a.eval += s.eval;
    a.other += s.other;
    a.lost_steps += s.lost_steps;
  }
  for (size_t i = 1; i < a.segments.size(); ++i) {
    a.gaps.push_back(a.segments[i].process_start - a.segments[i - 1].last_time);
    a.gaps_total += a.gaps.back();
  }
}

}  // namespace

GoodputAccount goodput_account(const std::vector<MetricsRecord>& records) {
  GoodputAccount a;
  for (const auto& r : records) {
    const std::string e = r.event();
    if (e == "start" || e == "resume") {
      if (!a.segments.empty()) close_segment(a.segments.back(), false);
      a.segments.push_back(open_segment(r, static_cast<int>(a.segments.size()) + 1));
    } else if (!a.segments.empty()) {
      add_record(a.segments.back(), r);
    }
  }
  if (!a.segments.empty()) close_segment(a.segments.back(), true);
  add_totals(a);
  return a;
}

std::vector<MetricsRecord> read_metrics_log(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError(path + ": no metrics log (h5ddp-train writes RUN_DIR/metrics.jsonl unless --no-metrics); " +
                      "nothing to account for");
  std::vector<MetricsRecord> records;
  bool run = false;
  for (std::string line; std::getline(in, line);) {
    auto r = MetricsRecord::parse(line);
    if (!r) continue;
    run = run || r->event() == "start" || r->event() == "resume";
    records.push_back(std::move(*r));
  }
  if (!run) throw ConfigError(path + ": holds no start or resume record: no run recorded, nothing to account for");
  return records;
}

namespace {

std::string percent(double part, double whole) {
  return whole > 0 ? format("%.1f%%", 100.0 * part / whole) : std::string("-");
}

std::string segment_row(const SegmentAccount& s) {
  const std::string began = s.resumed ? format("resume@%lld", static_cast<long long>(s.first_step)) : "start";
  return format("%-4d %-12s %6lld %6lld  %-18s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8s\n", s.index, began.c_str(),
                static_cast<long long>(s.first_step), static_cast<long long>(s.last_step), s.ended.c_str(), s.wall,
                s.train_kept, s.train_lost, s.blocked, s.startup, s.eval, s.other,
                percent(s.train_kept, s.wall).c_str());
}

}  // namespace

std::string goodput_report(const GoodputAccount& a, const std::string& source) {
  std::string out = "goodput of " + source + ": " + std::to_string(a.segments.size()) + " segment" +
                    (a.segments.size() == 1 ? "" : "s") + " (seconds; a segment: process start to its last record)\n";
  out += format("%-4s %-12s %6s %6s  %-18s %9s %9s %9s %9s %9s %9s %9s %8s\n", "seg", "began", "from", "to", "ended",
                "wall", "train", "lost", "saves", "start-up", "eval", "other", "goodput");
  for (size_t i = 0; i < a.segments.size(); ++i) {
    const SegmentAccount& s = a.segments[i];
    out += segment_row(s);
    if (s.lost_steps > 0)
      out += format("     lost: steps %lld-%lld (%lld) trained, then redone after the restart: %.2f s\n",
                    static_cast<long long>(s.lost_first), static_cast<long long>(s.lost_last),
                    static_cast<long long>(s.lost_steps), s.train_lost);
    if (s.resumed) out += format("     start-up %.2f s includes the checkpoint load, %.2f s\n", s.startup, s.load);
    if (!s.process_start_known) out += "     (no process_start in its first record: start-up not known, 0)\n";
    if (i < a.gaps.size()) out += format("     gap to segment %d: %.2f s (not in the total)\n", s.index + 1, a.gaps[i]);
  }
  out +=
      format("%-4s %-12s %6s %6s  %-18s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8s\n", "all", "", "", "", "", a.wall,
             a.train_kept, a.train_lost, a.blocked, a.startup, a.eval, a.other, percent(a.train_kept, a.wall).c_str());
  out += format(
      "goodput = kept training / segments' wall = %.2f / %.2f s = %s; lost to redone steps: %lld steps, "
      "%.2f s; gaps between segments (queue waits, launch before exec): %.2f s\n",
      a.train_kept, a.wall, percent(a.train_kept, a.wall).c_str(), static_cast<long long>(a.lost_steps), a.train_lost,
      a.gaps_total);
  return out;
}

namespace {

std::string json_parts(const char* prefix, double wall, double startup, double kept, double lost, double blocked,
                       double eval, double other) {
  return format(
      "%s\"wall\":%.6f,\"startup\":%.6f,\"train_kept\":%.6f,\"train_lost\":%.6f,\"blocked\":%.6f,\"eval\":%.6f,"
      "\"other\":%.6f,\"goodput\":%.6f",
      prefix, wall, startup, kept, lost, blocked, eval, other, wall > 0 ? kept / wall : 0.0);
}

}  // namespace

std::string goodput_json(const GoodputAccount& a) {
  std::string out = "{\"segments\":[";
  for (size_t i = 0; i < a.segments.size(); ++i) {
    const SegmentAccount& s = a.segments[i];
    out += i ? "," : "";
    out += format("{\"index\":%d,\"resumed\":%s,\"first_step\":%lld,\"last_step\":%lld,\"world_size\":%d,", s.index,
                  s.resumed ? "true" : "false", static_cast<long long>(s.first_step),
                  static_cast<long long>(s.last_step), s.world_size);
    out += format("\"process_start\":%.6f,\"process_start_known\":%s,\"last_time\":%.6f,\"ended\":%s,\"load\":%.6f,",
                  s.process_start, s.process_start_known ? "true" : "false", s.last_time, json_quote(s.ended).c_str(),
                  s.load);
    out += format("\"lost_steps\":%lld,\"lost_first\":%lld,\"lost_last\":%lld,", static_cast<long long>(s.lost_steps),
                  static_cast<long long>(s.lost_first), static_cast<long long>(s.lost_last));
    out += json_parts("", s.wall, s.startup, s.train_kept, s.train_lost, s.blocked, s.eval, s.other) + "}";
  }
  out += "],\"gaps\":[";
  for (size_t i = 0; i < a.gaps.size(); ++i) out += format("%s%.6f", i ? "," : "", a.gaps[i]);
  out += "],\"total\":{" +
         format("\"lost_steps\":%lld,\"gaps\":%.6f,", static_cast<long long>(a.lost_steps), a.gaps_total);
  return out + json_parts("", a.wall, a.startup, a.train_kept, a.train_lost, a.blocked, a.eval, a.other) + "}}";
}

std::string goodput_line(const GoodputAccount& a) {
  if (a.segments.empty()) return "goodput: no segment recorded";
  const SegmentAccount& s = a.segments.back();
  return format(
      "goodput: this segment %s (training %.1f s of %.1f s; saves %.1f s, start-up %.1f s, eval %.1f s, other %.1f "
      "s); the run %s over %zu segment%s (%lld steps redone, %.1f s)",
      percent(s.train_kept, s.wall).c_str(), s.train_kept, s.wall, s.blocked, s.startup, s.eval, s.other,
      percent(a.train_kept, a.wall).c_str(), a.segments.size(), a.segments.size() == 1 ? "" : "s",
      static_cast<long long>(a.lost_steps), a.train_lost);
}

namespace {
std::atomic<double> g_main_entry{0};

// This process's start in seconds after boot (/proc/self/stat field 22, clock ticks); < 0 when not readable.
double start_after_boot() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i)
    if (i == 22) return std::strtod(field.c_str(), nullptr) / static_cast<double>(sysconf(_SC_CLK_TCK));
  return -1;
}
}  // namespace

void note_main_entry() {
  double zero = 0;
  g_main_entry.compare_exchange_strong(zero, now_epoch());
}

ProcessStart process_start() {
  const double after_boot = start_after_boot();
  timespec boot{};
  if (after_boot >= 0 && clock_gettime(CLOCK_BOOTTIME, &boot) == 0) {
    const double boot_now = static_cast<double>(boot.tv_sec) + 1e-9 * static_cast<double>(boot.tv_nsec);
    return {now_epoch() - (boot_now - after_boot), "proc"};
  }
  note_main_entry();  // no /proc: the top of main() (or now, when main did not note it)
  return {g_main_entry.load(), "main"};
}

}  // namespace h5ddp

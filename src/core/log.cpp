#include "h5ddp/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "h5ddp/error.hpp"

namespace h5ddp::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
std::atomic<int> g_rank{-1};
std::mutex g_mutex;
const char* level_name(Level l) {
  switch (l) {
    case Level::kDebug:
      return "DEBUG";
    case Level::kInfo:
      return "INFO";
    case Level::kWarn:
      return "WARN";
    case Level::kError:
      return "ERROR";
  }
  return "?";
}
}  // namespace

void set_level(Level level) {
  g_level = static_cast<int>(level);
}
Level level() {
  return static_cast<Level>(g_level.load());
}

void init_from_env() {
  const char* v = std::getenv("H5DDP_LOG_LEVEL");
  if (!v) return;
  if (!std::strcmp(v, "debug"))
    set_level(Level::kDebug);
  else if (!std::strcmp(v, "info"))
    set_level(Level::kInfo);
  else if (!std::strcmp(v, "warn"))
    set_level(Level::kWarn);
  else if (!std::strcmp(v, "error"))
    set_level(Level::kError);
}

void write(Level l, const std::string& message) {
  if (static_cast<int>(l) < g_level.load()) return;
  std::string line = process_tag() + " " + level_name(l) + " " + message + "\n";
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void root_info(const std::string& m) {
  if (g_rank.load() > 0 || static_cast<int>(Level::kInfo) < g_level.load()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "%s\n", m.c_str());
  std::fflush(stderr);
}

namespace detail {
void set_rank(int rank) {
  g_rank = rank;
}
}  // namespace detail

}  // namespace h5ddp::log

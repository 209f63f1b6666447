// Minimal rank-aware logging to stderr. Messages carry "[host rank r/N]"; `root_only` lines print on rank 0.
#pragma once

#include <string>

namespace h5ddp::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_level(Level level);
Level level();
// Level from H5DDP_LOG_LEVEL (debug|info|warn|error), default info.
void init_from_env();

void write(Level level, const std::string& message);
inline void debug(const std::string& m) {
  write(Level::kDebug, m);
}
inline void info(const std::string& m) {
  write(Level::kInfo, m);
}
inline void warn(const std::string& m) {
  write(Level::kWarn, m);
}
inline void error(const std::string& m) {
  write(Level::kError, m);
}
// Prints only on world rank 0 (after MpiEnv started; on every process before).
void root_info(const std::string& m);

namespace detail {
void set_rank(int rank);
}

}  // namespace h5ddp::log

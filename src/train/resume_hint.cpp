#include "train/resume_hint.hpp"

#include <unistd.h>

#include <cstdlib>
#include <thread>

namespace h5ddp {

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    const bool plain = !w.empty() && w.find_first_of(" \t\n'\"\\$`;&|<>()*?[]{}~!#") == std::string::npos;
    std::string quoted = "'";
    for (char c : w) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += (out.empty() ? "" : " ") + (plain ? w : quoted + "'");
  }
  return out;
}

std::vector<std::string> without_options(const std::vector<std::string>& args, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    bool drop = false;
    for (const auto& n : names) {
      if (args[i] == n) {
        drop = true;
        ++i;  // its value
      } else if (args[i].rfind(n + "=", 0) == 0) {
        drop = true;
      }
      if (drop) break;
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

std::string resume_command(const ResumeHintFacts& f) {
  if (!f.launcher_hint.empty()) return f.launcher_hint;
  std::vector<std::string> words{"mpirun", "-np", std::to_string(f.world_size)};
  if (f.root_user) words.push_back("--allow-run-as-root");
  if (f.oversubscribed) words.push_back("--oversubscribe");
  words.push_back(f.argv.empty() ? std::string("h5ddp-train") : f.argv[0]);
  if (!f.argv.empty()) {
    const std::vector<std::string> kept =
        without_options(std::vector<std::string>(f.argv.begin() + 1, f.argv.end()), {"--resume", "--init-from"});
    words.insert(words.end(), kept.begin(), kept.end());
  }
  return shell_join(words);
}

ResumeHintFacts this_process_facts(const std::vector<std::string>& argv, int world_size, int local_size) {
  ResumeHintFacts facts;
  facts.argv = argv;
  facts.world_size = world_size;
  facts.root_user = ::geteuid() == 0;
  facts.oversubscribed = local_size > static_cast<int>(std::thread::hardware_concurrency());
  if (const char* hint = std::getenv("H5DDP_RESUME_HINT")) facts.launcher_hint = hint;
  return facts;
}

}  // namespace h5ddp

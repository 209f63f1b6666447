// h5ddp-ckpt goodput RUN_DIR [--json]: the goodput account of a run directory's metrics log (train/goodput.hpp,
// docs/GOODPUT.md). Reads RUN_DIR/metrics.jsonl only; no checkpoint is opened.
#include "train/goodput.hpp"

#include <cstdio>
#include <filesystem>
#include <string>

#include "ckpt/subcommands.hpp"

namespace h5ddp::ckpt_tool {

int run_goodput(const Args& args) {
  std::string dir;
  bool json = false;
  for (const auto& a : args) {
    if (a == "--json") {
      json = true;
    } else if (dir.empty() && (a.empty() || a[0] != '-')) {
      dir = a;
    } else {
      std::fprintf(stderr, "usage: h5ddp-ckpt goodput RUN_DIR [--json]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: h5ddp-ckpt goodput RUN_DIR [--json]\n");
    return 2;
  }
  // A metrics.jsonl given instead of its run directory works too.
  const std::string path = std::filesystem::is_directory(dir) ? dir + "/metrics.jsonl" : dir;
  const GoodputAccount account = goodput_account(read_metrics_log(path));
  std::printf("%s", json ? (goodput_json(account) + "\n").c_str() : goodput_report(account, path).c_str());
  return 0;
}

}  // namespace h5ddp::ckpt_tool

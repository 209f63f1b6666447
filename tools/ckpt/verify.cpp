// h5ddp-ckpt verify FILE...
#include <cstdio>

#include "ckpt/subcommands.hpp"
#include "h5ddp/checkpoint.hpp"

namespace h5ddp::ckpt_tool {

int run_verify(const Args& args) {
  if (args.empty()) {
    std::fprintf(stderr, "usage: h5ddp-ckpt verify FILE...\n");
    return 2;
  }
  int bad = 0;
  for (const auto& path : args) {
    const VerifyReport r = verify_checkpoint_file(path);
    for (const auto& n : r.notes) std::printf("note    %s\n", n.c_str());
    if (r.ok) {
      std::printf("OK      %s\n", path.c_str());
      continue;
    }
    ++bad;
    std::printf("FAILED  %s\n", path.c_str());
    for (const auto& p : r.problems) std::printf("  %s\n", p.c_str());
  }
  if (args.size() > 1) std::printf("%zu of %zu valid\n", args.size() - bad, args.size());
  return bad ? 1 : 0;
}

}  // namespace h5ddp::ckpt_tool

// h5ddp-ckpt: inspect, verify and compare h5ddp checkpoints. A table of subcommands, each in tools/ckpt/.
// Runs as one process (no mpirun needed): it reads files with HDF5's serial driver.
#include <cstdio>
#include <cstring>
#include <exception>

#include "ckpt/subcommands.hpp"

namespace {

struct Subcommand {
  const char* name;
  const char* usage;
  int (*run)(const h5ddp::ckpt_tool::Args&);
};

const Subcommand kSubcommands[] = {
    {"info", "info FILE            step, world size, versions, optimizer, dataset tree with sizes",
     h5ddp::ckpt_tool::run_info},
    {"verify", "verify FILE...       recompute every checksum, check the layout (exit 0 = all valid)",
     h5ddp::ckpt_tool::run_verify},
    {"diff", "diff A B             per-tensor max abs/rel difference (exit 0 identical, 1 differ, 2 error)",
     h5ddp::ckpt_tool::run_diff},
    {"export",
     "export FILE --to OUT.pt [--add-prefix module.]   a dict for torch.load (model, optimizer, counters);\n"
     "         --format safetensors --to OUT.safetensors: the model's weights only",
     h5ddp::ckpt_tool::run_export},
    {"import",
     "import IN.pt --to FILE.h5 [--model cnn|mlp]      a torch.save'd state dict as a checkpoint for --init-from",
     h5ddp::ckpt_tool::run_import},
    {"eval", "eval FILE [--count N]  loss and accuracy of the checkpoint's model on Fashion-MNIST test images",
     h5ddp::ckpt_tool::run_eval},
};

int usage(FILE* out) {
  std::fprintf(out, "usage: h5ddp-ckpt <command> [args]\ncommands:\n");
  for (const auto& s : kSubcommands) std::fprintf(out, "  %s\n", s.usage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  if (!std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) return usage(stdout), 0;
  for (const auto& s : kSubcommands) {
    if (std::strcmp(argv[1], s.name) != 0) continue;
    try {
      return s.run(h5ddp::ckpt_tool::Args(argv + 2, argv + argc));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "h5ddp-ckpt %s: %s\n", s.name, e.what());
      return std::strcmp(s.name, "diff") == 0 ? 2 : 1;
    }
  }
  std::fprintf(stderr, "h5ddp-ckpt: unknown command '%s'\n", argv[1]);
  return usage(stderr);
}

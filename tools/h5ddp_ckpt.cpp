// h5ddp-ckpt: inspect, verify and compare h5ddp checkpoints. A table of subcommands, each in tools/ckpt/.
// Runs as one process (no mpirun needed): it reads files with HDF5's serial driver.
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>

#include "ckpt/subcommands.hpp"
#include "h5ddp/run_dir.hpp"

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
    {"goodput",
     "goodput RUN_DIR [--json]   the run's time across its restarts (RUN_DIR/metrics.jsonl): per segment training\n"
     "         kept and lost (redone after a kill), blocking saves, start-up and load, evaluation; gaps apart",
     h5ddp::ckpt_tool::run_goodput},
    {"export",
     "export FILE --to OUT.pt [--add-prefix module.]   a dict for torch.load (model, optimizer, counters);\n"
     "         --format safetensors --to OUT.safetensors: the model's weights only",
     h5ddp::ckpt_tool::run_export},
    {"import",
     "import IN.pt --to FILE.h5 [--model cnn|mlp]      a torch.save'd state dict as a checkpoint for --init-from",
     h5ddp::ckpt_tool::run_import},
    {"eval",
     "eval FILE [--data D.h5 | --data-dir DIR] [--split S] [--first N] [--count N] [--model cnn|mlp | --model-file "
     "M.pt]\n"
     "         loss and accuracy of the checkpoint's model on test samples: the run's --data (/meta data_file) or "
     "Fashion-MNIST",
     h5ddp::ckpt_tool::run_eval},
};

// A run directory's `latest` or `best` given where a checkpoint is expected: the checkpoint it names, said on
// stderr (the pointer file is a line of text, not a checkpoint). Other arguments are returned as they are.
std::string follow_pointer(const std::string& arg) {
  namespace fs = std::filesystem;
  const fs::path p(arg);
  const std::string name = p.filename().string();
  std::error_code ec;
  if ((name != "latest" && name != h5ddp::RunDir::kBestFile) || !fs::is_regular_file(p, ec)) return arg;
  char magic[4] = {};
  std::ifstream(arg, std::ios::binary).read(magic, sizeof magic);
  if (std::memcmp(magic, "\x89HDF", 4) == 0) return arg;  // a checkpoint that happens to be called so
  const h5ddp::RunDir dir(p.has_parent_path() ? p.parent_path().string() : ".");
  std::string target = dir.latest();
  if (name == h5ddp::RunDir::kBestFile) target = dir.best() ? dir.best()->file : "";
  if (target.empty()) return arg;  // unreadable: the subcommand's own error names the file
  const std::string resolved = dir.file_path(target);
  std::fprintf(stderr, "h5ddp-ckpt: %s is the run directory's pointer file; using the checkpoint it names, %s\n",
               arg.c_str(), resolved.c_str());
  return resolved;
}

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
      h5ddp::ckpt_tool::Args args(argv + 2, argv + argc);
      for (size_t i = 0; i < args.size(); ++i)  // inputs only: never the output a --to names
        if (i == 0 || args[i - 1] != "--to") args[i] = follow_pointer(args[i]);
      return s.run(args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "h5ddp-ckpt %s: %s\n", s.name, e.what());
      return std::strcmp(s.name, "diff") == 0 ? 2 : 1;
    }
  }
  std::fprintf(stderr, "h5ddp-ckpt: unknown command '%s'\n", argv[1]);
  return usage(stderr);
}

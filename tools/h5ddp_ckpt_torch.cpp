// h5ddp-ckpt-torch: the subcommands of h5ddp-ckpt that need LibTorch (export, import, eval). h5ddp-ckpt
// execs it from its own directory, so `h5ddp-ckpt verify` stays a small HDF5-only program.
// Runs as one process, or under mpirun (every rank reads, rank 0 writes the .pt file).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt_torch/interop.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "train/batch.hpp"

namespace {

constexpr const char* kUsage =
    "usage: h5ddp-ckpt <command> ...   (LibTorch commands, run by h5ddp-ckpt-torch)\n"
    "  export FILE --to OUT.pt [--add-prefix module.]\n"
    "  export FILE --format safetensors --to OUT.safetensors [--add-prefix P]   the model's weights only\n"
    "        write a dict that torch.load reads: model (state dict), optimizer (torch.optim state dict keyed\n"
    "        by parameter name), optimizer_type, step, epoch, samples_consumed, lr_scheduler, data, rng_cpu, meta\n"
    "  import IN.pt --to FILE.h5 [--model cnn|mlp [--mlp-hidden 1024,1024]] [--force]\n"
    "        turn a torch.save'd state dict (plain, or the 'model'/'state_dict' entry of a dict; 'module.'\n"
    "        prefixes stripped) into a step-0, model-only checkpoint for h5ddp-train --init-from FILE.h5;\n"
    "        --model checks keys and shapes against a built-in model\n"
    "  eval FILE [--data-dir DIR | --data FILE.h5] [--split t10k|test|train] [--first N] [--count N]\n"
    "       [--model cnn|mlp | --model-file MODEL.pt]\n"
    "        mean cross-entropy and accuracy (float targets: mean squared error) of the checkpoint's model on\n"
    "        samples [first, first + count) of Fashion-MNIST or of an HDF5 data set (docs/DATA.md), in eval mode\n"
    "        (default: the whole split, as h5ddp-train's final evaluation);\n"
    "        a TorchScript model is the checkpoint's model_file unless --model-file names one; the data is the\n"
    "        checkpoint's --data file (/meta data_file) unless --data or --data-dir names other data\n";

// Command line: positional arguments and --name value options (flags in `flags` take no value).
struct CommandLine {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;
};

CommandLine parse(int argc, char** argv, int start, const std::vector<std::string>& valued,
                  const std::vector<std::string>& flags) {
  CommandLine c;
  for (int i = start; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      c.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (std::find(valued.begin(), valued.end(), name) != valued.end()) {
      if (i + 1 >= argc) throw h5ddp::ConfigError("--" + name + " needs a value");
      value = argv[++i];
    }
    const bool known = std::find(valued.begin(), valued.end(), name) != valued.end() ||
                       std::find(flags.begin(), flags.end(), name) != flags.end();
    if (!known) throw h5ddp::ConfigError("unknown option --" + name);
    c.options[name] = value;
  }
  return c;
}

std::string one_file(const CommandLine& c, const char* what) {
  if (c.positional.size() != 1)
    throw h5ddp::ConfigError(std::string("expects exactly one ") + what + ", got " +
                             std::to_string(c.positional.size()));
  return c.positional[0];
}

int64_t to_int(const std::string& option, const std::string& s) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) throw h5ddp::ConfigError("--" + option + " expects an integer, got '" + s + "'");
  return v;
}

std::vector<int64_t> int_list(const std::string& option, const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string w; std::getline(ss, w, ',');) out.push_back(to_int(option, w));
  return out;
}

// Runs the subcommand. Usage errors throw ConfigError before MPI starts; the rest run under MPI.
int run(const std::string& command, int argc, char** argv, h5ddp::MpiComm* comm, bool dry) {
  using namespace h5ddp::interop;
  const bool root = comm == nullptr || comm->rank() == 0;
  if (command == "export") {
    const auto c = parse(argc, argv, 2, {"to", "add-prefix", "format"}, {});
    ExportOptions o;
    o.input = one_file(c, "checkpoint FILE");
    if (!c.options.count("to")) throw h5ddp::ConfigError("needs --to OUT.pt (or --format safetensors --to OUT)");
    o.output = c.options.at("to");
    if (c.options.count("add-prefix")) o.add_prefix = c.options.at("add-prefix");
    const bool st_name = o.output.size() > 12 && o.output.substr(o.output.size() - 12) == ".safetensors";
    o.format = c.options.count("format") ? c.options.at("format") : (st_name ? "safetensors" : "pt");
    if (o.format != "pt" && o.format != "safetensors")
      throw h5ddp::ConfigError("--format is pt or safetensors, got '" + o.format + "'");
    if (dry) return 0;
    const size_t n = export_checkpoint(*comm, o);
    if (root && o.format == "safetensors")
      std::printf("exported the %zu model tensors of %s to %s (safetensors, weights only)\n", n, o.input.c_str(),
                  o.output.c_str());
    else if (root)
      std::printf(
          "exported %s to %s: a dict of model (%zu tensors), optimizer, optimizer_type, step, epoch, "
          "samples_consumed, lr_scheduler, data, rng_cpu, meta, h5ddp (torch.load reads it)\n",
          o.input.c_str(), o.output.c_str(), n);
    return 0;
  }
  if (command == "import") {
    const auto c = parse(argc, argv, 2, {"to", "model", "mlp-hidden"}, {"force"});
    ImportOptions o;
    o.input = one_file(c, "torch.save FILE");
    if (!c.options.count("to")) throw h5ddp::ConfigError("needs --to FILE.h5");
    o.output = c.options.at("to");
    if (c.options.count("model")) o.model = c.options.at("model");
    if (c.options.count("mlp-hidden")) o.mlp_hidden = int_list("mlp-hidden", c.options.at("mlp-hidden"));
    o.force = c.options.count("force") > 0;
    if (dry) return 0;
    const size_t n = import_state_dict(*comm, o);
    if (root)
      std::printf(
          "imported %zu tensors of %s into %s (step 0, model only)\nstart a fresh run from it (a run dir of its own): "
          "h5ddp-train --init-from %s --run-dir runs/finetune\n",
          n, o.input.c_str(), o.output.c_str(), o.output.c_str());
    return 0;
  }
  if (command == "eval") {
    const auto c = parse(argc, argv, 2, {"data-dir", "data", "split", "first", "count", "model", "model-file"}, {});
    EvalOptions o;
    o.input = one_file(c, "checkpoint FILE");
    if (c.options.count("data-dir")) o.data_dir = c.options.at("data-dir"), o.data_dir_given = true;
    if (c.options.count("split")) o.split = c.options.at("split");
    if (c.options.count("first")) o.first = to_int("first", c.options.at("first"));
    if (c.options.count("count")) o.count = to_int("count", c.options.at("count"));
    if (c.options.count("count") && o.count < 0) throw h5ddp::ConfigError("--count must be >= 0");
    if (c.options.count("model")) o.model = c.options.at("model");
    if (c.options.count("model-file")) o.model_file = c.options.at("model-file");
    if (c.options.count("data")) {
      o.data_file = c.options.at("data");
      if (!c.options.count("split")) o.split = "test";
      if (o.split != "test" && o.split != "train") throw h5ddp::ConfigError("--split is test or train with --data");
    } else if (o.split != "t10k" && o.split != "train") {
      throw h5ddp::ConfigError("--split is t10k or train");
    }
    if (dry) return 0;
    const EvalResult r = evaluate_checkpoint(*comm, o);
    if (root) std::printf("data %s\n", r.data.c_str());
    if (root && r.perplexity >= 0)  // a language model: per-token numbers
      std::printf("model %s  split %s  samples %lld  tokens %lld  loss %.9f  perplexity %.6f  accuracy %.6f\n",
                  r.model.c_str(), o.split.c_str(), static_cast<long long>(r.images),
                  static_cast<long long>(r.positions), r.loss, r.perplexity, r.accuracy);
    else if (root)
      std::printf("model %s  split %s  images %lld  loss %.9f  accuracy %.6f\n", r.model.c_str(), o.split.c_str(),
                  static_cast<long long>(r.images), r.loss, r.accuracy);  // accuracy -1: regression
    return 0;
  }
  throw h5ddp::ConfigError("unknown command '" + command + "'");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  try {
    run(command, argc, argv, nullptr, /*dry=*/true);  // option errors: exit 2 before MPI starts
  } catch (const std::exception& e) {
    std::fprintf(stderr, "h5ddp-ckpt %s: %s\n%s", command.c_str(), e.what(), kUsage);
    return 2;
  }
  h5ddp::log::init_from_env();
  h5ddp::keep_freed_memory_in_heap();  // eval: the activations freed after every batch are reused, not re-faulted
  h5ddp::MpiEnv env(&argc, &argv);
  std::unique_ptr<h5ddp::MpiComm> comm;
  try {
    comm = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
    return run(command, argc, argv, comm.get(), false);
  } catch (const std::exception& e) {
    // Errors are agreed across ranks (raise_if_any) before they surface, so every rank gets here; a lone
    // process just reports and exits 1.
    if (comm && comm->size() > 1) {
      comm.reset();
      return h5ddp::exit_code_for(e, ("h5ddp-ckpt " + command).c_str());
    }
    std::fprintf(stderr, "h5ddp-ckpt %s: %s\n", command.c_str(), e.what());
    return 1;
  }
}

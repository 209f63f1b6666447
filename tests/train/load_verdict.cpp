// h5ddp-load-verdict [h5ddp-train options] -- FILE...: the C++ loader's verdict on each file, as h5ddp-train
// would reach it (issue 45's conformance suite). For each file, a fresh model and optimizer built from the options
// exactly as h5ddp-train builds them, then Checkpointer::resume_from, then h5ddp-train's model-identity check.
// One line per file on stdout:
//   OK <file>                 loaded
//   MISMATCH <file>: <why>    another model (h5ddp-train ends the run)
//   DAMAGED <file>: <why>     not a valid checkpoint (h5ddp-train --resume auto falls back past it)
// Exit 0 when every file got a verdict. Runs at 1 rank (MPI singleton).
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "h5ddp/checkpointer.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "train/config.hpp"
#include "train/loop_setup.hpp"
#include "train/models.hpp"

namespace {

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

// The verdict on one file: a fresh model (same seed: same initial weights) and optimizer per file.
std::string verdict(h5ddp::MpiComm& comm, const h5ddp::TrainConfig& config, const std::string& file) {
  torch::manual_seed(config.seed);
  h5ddp::TrainModel model = h5ddp::build_train_model(config.model);
  auto optimizer = h5ddp::make_optimizer(config, model.module->parameters());
  h5ddp::Checkpointer ckpt(comm, *model.module, *optimizer, h5ddp::checkpointer_options(config));
  try {
    const h5ddp::ResumeInfo info = ckpt.resume_from(file);
    const std::string other = h5ddp::model_identity_difference(info.meta, model);
    if (!other.empty()) return "MISMATCH " + file + ": " + other;
    return "OK " + file;
  } catch (const h5ddp::CheckpointMismatchError& e) {
    return "MISMATCH " + file + ": " + first_line(e.what());
  } catch (const h5ddp::DisagreementError& e) {
    return "DISAGREEMENT " + file + ": " + first_line(e.what());
  } catch (const h5ddp::Error& e) {
    return "DAMAGED " + file + ": " + first_line(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<const char*> train_args = {argv[0]};
  std::vector<std::string> files;
  bool after = false;
  for (int i = 1; i < argc; ++i) {
    if (!after && std::string(argv[i]) == "--") {
      after = true;
      continue;
    }
    if (after)
      files.emplace_back(argv[i]);
    else
      train_args.push_back(argv[i]);
  }
  const h5ddp::ParsedArgs args = h5ddp::parse_train_args(static_cast<int>(train_args.size()), train_args.data());
  if (!args.config || files.empty()) {
    std::fprintf(stderr, "usage: h5ddp-load-verdict [h5ddp-train options] -- FILE...\n%s\n", args.message.c_str());
    return 2;
  }
  h5ddp::MpiEnv env(&argc, &argv);
  auto comm = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
  torch::set_num_threads(1);
  for (const auto& f : files) std::printf("%s\n", verdict(*comm, *args.config, f).c_str());
  return 0;
}

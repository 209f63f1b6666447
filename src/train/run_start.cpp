#include "train/run_start.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/sampler.hpp"
#include "train/run_log.hpp"

namespace h5ddp {
namespace {

// Local. The strings of a checkpoint's /meta group; empty when the file cannot be read.
std::map<std::string, std::string> read_checkpoint_meta(const std::string& path) {
  try {
    return CheckpointFile(path).meta();
  } catch (const Error&) {
    return {};
  }
}

constexpr const char* kOtherModelRemedy =
    "to continue that run, start it with the model that wrote the checkpoint (h5ddp-ckpt info FILE names it in "
    "/meta); to train this model, give it another --run-dir, or --resume none to start over in this one";

// Collective. The mismatch a resume raised, with which model the refused file holds (from its /meta) and what to
// do; thrown on every rank.
[[noreturn]] void throw_with_model_named(const CheckpointMismatchError& e, Comm& comm, const TrainModel& model) {
  std::string holds;  // e.file(): the file the resume refused, set by the Checkpointer on every rank
  if (comm.rank() == 0 && !e.file().empty()) holds = model_identity_difference(read_checkpoint_meta(e.file()), model);
  holds = comm.broadcast_string(holds, 0);  // every rank, whatever rank 0 found
  // The verdict and the remedy first, the per-tensor details (which can be many lines) after them.
  const std::string what = e.what();
  const size_t first_line = std::min(what.find('\n'), what.size());
  CheckpointMismatchError more(Error::Untagged{},
                               what.substr(0, first_line) + "\n  " +
                                   (holds.empty() ? "this run's model: " + model.description : holds) + "\n  " +
                                   kOtherModelRemedy + what.substr(first_line));
  more.set_file(e.file());
  if (!e.agreed()) throw more;
  throw_agreed(more);  // every rank raised it
}

// Collective (the same verdict everywhere: every rank read the same /meta). --init-from starts a fresh run; in a
// run dir that already holds a checkpoint it applies only when that checkpoint's run was started from the same
// file (the fine-tune requeued). Anything else is refused, naming both files: resuming the run dir's checkpoint
// silently would "fine-tune" from the wrong weights.
void check_init_from(const TrainConfig& config, Checkpointer& ckpt, Comm& comm, const ResumeInfo& info) {
  const auto it = info.meta.find(kInitFromMeta);
  const std::string started_from = it == info.meta.end() ? "" : it->second;
  if (!started_from.empty()) ckpt.set_meta(kInitFromMeta, started_from);  // provenance kept by later saves
  if (config.init_from.empty()) return;
  // Agreed: same_file asks each rank's view of the file system, which need not be the same on every node.
  agreed(comm, [&] {
    if (same_file(started_from, config.init_from)) return;
    throw ConfigError(
        "--init-from " + config.init_from + " starts a fresh run, but the run dir " + config.run_dir +
        " already holds checkpoints: --resume auto found " + info.path +
        (started_from.empty() ? " (not started from an --init-from file)" : " (started from " + started_from + ")") +
        ". Give the fine-tune its own --run-dir, or pass --resume none to start over in this one from " +
        config.init_from);
  });
  if (comm.rank() == 0)
    log::root_info("--init-from " + config.init_from + ": " + info.path +
                   " continues the run started from it; resuming that checkpoint");
}

// Collective. The resumed checkpoint fits this run: its model, --init-from, --batch-size; rank 0 says so.
void accept_resume(const TrainConfig& config, Checkpointer& ckpt, Comm& comm, const TrainModel& model,
                   const ResumeInfo& info) {
  const std::string other = model_identity_difference(info.meta, model);
  comm.raise_if_any(other.empty() ? "" : "cannot resume from " + info.path + ": " + other + "\n  " + kOtherModelRemedy);
  check_init_from(config, ckpt, comm, info);
  DataState& data = ckpt.data();
  if (config.batch_size_set && config.batch_size != data.global_batch) {
    log::root_info("warning: --batch-size " + std::to_string(config.batch_size) + " differs from the " +
                   std::to_string(data.global_batch) + " of the checkpoint; continuing with " +
                   std::to_string(config.batch_size) + " from sample " + std::to_string(data.position));
    data.global_batch = config.batch_size;
  }
  if (data.seed != config.seed)
    log::root_info("note: the data order continues with the checkpoint's seed " + std::to_string(data.seed));
  if (comm.rank() == 0)
    log::root_info(console::resumed_line(info.path, info.step, data.epoch, data.position, info.saved_world_size,
                                         comm.size(), info.rng_exact));
}

}  // namespace

std::string global_batch_problem(int64_t global_batch, int world_size, int64_t grad_accum, const std::string& origin) {
  try {
    check_global_batch(global_batch, world_size);
  } catch (const Error& e) {
    return std::string(e.what()) + (origin.empty() ? "" : " (" + origin + ")");
  }
  if ((global_batch / world_size) % grad_accum == 0) return "";
  return "--grad-accum " + std::to_string(grad_accum) + " does not divide the " +
         std::to_string(global_batch / world_size) + " samples per rank of the global batch " +
         std::to_string(global_batch) + " at " + std::to_string(world_size) + " ranks";
}

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code ec;
  const bool same = std::filesystem::equivalent(a, b, ec);
  return ec ? a == b : same;
}

RunStart start_run(const TrainConfig& config, Checkpointer& ckpt, Comm& comm, const TrainModel& model) {
  RunStart start;
  const auto load_start = std::chrono::steady_clock::now();
  try {
    if (config.resume == ResumeMode::kAuto)
      start.info = ckpt.resume();
    else if (config.resume == ResumeMode::kPath)
      start.info = ckpt.resume_from(config.resume_path);
  } catch (const CheckpointMismatchError& e) {
    throw_with_model_named(e, comm, model);
  }
  start.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  // A later --resume auto takes the highest step in the run dir: say which files of an older run would shadow.
  if (config.resume == ResumeMode::kNone) warn_of_checkpoints_in_fresh_run_dir(comm, config.run_dir);
  if (start.info.resumed) {
    accept_resume(config, ckpt, comm, model, start.info);
  } else if (!config.init_from.empty()) {
    ckpt.load_weights(config.init_from);
    ckpt.set_meta(kInitFromMeta, config.init_from);  // a requeued fine-tune resumes its own checkpoints
    if (comm.rank() == 0) log::root_info("initialised the weights from " + config.init_from);
  }
  comm.raise_if_any(global_batch_problem(
      ckpt.data().global_batch, comm.size(), config.grad_accum,
      start.info.resumed ? "the global batch of " + start.info.path + "; pass --batch-size to change it" : ""));
  return start;
}

}  // namespace h5ddp

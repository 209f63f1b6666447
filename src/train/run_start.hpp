// How h5ddp-train's run begins: --resume auto | PATH | none, --init-from FILE (weights only), and the checks that
// the checkpoint found fits this run (its model, the file the run was started from, its global batch at this
// world size). The trainer calls start_run() once, after building the model and the Checkpointer.
#pragma once

#include <cstdint>
#include <string>

#include "h5ddp/checkpointer.hpp"
#include "h5ddp/comm.hpp"
#include "train/config.hpp"
#include "train/models.hpp"

namespace h5ddp {

// /meta key of a run started with --init-from: the file its weights came from (docs/METRICS.md).
inline constexpr const char* kInitFromMeta = "init_from";

struct RunStart {
  ResumeInfo info;          // info.resumed false: a fresh start (possibly from --init-from weights)
  double load_seconds = 0;  // the resume's load
};

// Collective. Resumes per config.resume (a refused file: CheckpointMismatchError naming the model it holds, on
// every rank), or loads --init-from's weights into a fresh run; checks --init-from against the run dir's
// checkpoint, adopts --batch-size over the checkpoint's, and refuses a global batch this world size cannot
// split. Rank 0 prints the resume line. Throws the same error on every rank.
RunStart start_run(const TrainConfig& config, Checkpointer& ckpt, Comm& comm, const TrainModel& model);

// Local, pure. Why `global_batch` cannot be trained at `world_size` ranks with `grad_accum` micro-batches ("" it
// can): it must split evenly over the ranks (`origin`, e.g. "the global batch of FILE", is appended to that
// problem), and each rank's share over the micro-batches.
std::string global_batch_problem(int64_t global_batch, int world_size, int64_t grad_accum,
                                 const std::string& origin = "");

// Local. Whether two paths name the same file (the text when either cannot be resolved); false for "".
bool same_file(const std::string& a, const std::string& b);

}  // namespace h5ddp

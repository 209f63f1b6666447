#include "train/keep_best.hpp"

#include <filesystem>
#include <optional>
#include <utility>

#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/run_dir.hpp"

namespace h5ddp {

KeepBest::KeepBest(std::string run_dir, bool fsync, Checkpointer& ckpt, Comm& comm)
    : run_dir_(std::move(run_dir)), fsync_(fsync), ckpt_(ckpt), comm_(comm) {}

void KeepBest::load() {
  const RunDir dir(run_dir_);
  const std::optional<BestPointer> best = dir.best(comm_);  // rank 0 reads it, every rank gets the same
  if (best && std::filesystem::exists(dir.file_path(best->file))) {
    file_ = best->file;
    accuracy_ = best->value;
    ckpt_.set_keep_files({file_});
  }
}

bool KeepBest::offer(double accuracy, int64_t step) {
  if (!(accuracy > accuracy_)) return false;
  offered_ = accuracy;
  kept_before_ = file_.empty() ? std::vector<std::string>{} : std::vector<std::string>{file_};
  ckpt_.set_keep_files({format::checkpoint_file_name(step)});
  return true;
}

void KeepBest::commit(const std::function<void()>& save) {
  if (ckpt_.last_saved_step() != ckpt_.step()) save();
  ckpt_.wait();  // `best` names a committed file only
  if (ckpt_.last_saved_step() != ckpt_.step()) {
    ckpt_.set_keep_files(kept_before_);
    return;
  }
  accuracy_ = offered_;
  file_ = format::checkpoint_file_name(ckpt_.step());
  if (comm_.rank() == 0) write_pointer();
  comm_.barrier();
}

// Rank 0. RUN_DIR/best = "<file> <accuracy>", moved like `latest` (RunDir::move_best). A failure is reported: the
// best checkpoint itself is committed either way.
void KeepBest::write_pointer() const {
  try {
    RunDir(run_dir_).move_best(file_, accuracy_, fsync_);
  } catch (const Error& e) {
    log::warn(std::string("--keep-best: ") + e.what());
  }
}

}  // namespace h5ddp

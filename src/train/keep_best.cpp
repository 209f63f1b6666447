#include "train/keep_best.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "checkpoint/format.hpp"
#include "core/log.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"

namespace h5ddp {

KeepBest::KeepBest(std::string run_dir, bool fsync, Checkpointer& ckpt, Comm& comm)
    : run_dir_(std::move(run_dir)), fsync_(fsync), ckpt_(ckpt), comm_(comm) {}

void KeepBest::load() {
  std::string text;
  if (comm_.rank() == 0) {
    std::ifstream in(run_dir_ + "/best");
    std::getline(in, text);
  }
  text = comm_.broadcast_string(text, 0);
  std::istringstream is(text);
  std::string name;
  double accuracy = -1;
  if (is >> name >> accuracy && std::filesystem::exists(run_dir_ + "/" + name)) {
    file_ = name;
    accuracy_ = accuracy;
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

// Rank 0. RUN_DIR/best = "<file> <accuracy>", moved like `latest` (write_run_dir_pointer). A failure is reported:
// the best checkpoint itself is committed either way.
void KeepBest::write_pointer() const {
  char line[512];
  std::snprintf(line, sizeof line, "%s %.6f\n", file_.c_str(), accuracy_);
  try {
    write_run_dir_pointer(run_dir_, "best", line, fsync_);
  } catch (const Error& e) {
    log::warn(std::string("--keep-best: ") + e.what());
  }
}

}  // namespace h5ddp

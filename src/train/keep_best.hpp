// --keep-best: the checkpoint of the best test accuracy so far is kept by retention beside the newest K and named
// by RUN_DIR/best ("<file> <accuracy>"), which moves like `latest` once that file is committed.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "h5ddp/checkpointer.hpp"
#include "h5ddp/comm.hpp"

namespace h5ddp {

class KeepBest {
 public:
  KeepBest(std::string run_dir, bool fsync, Checkpointer& ckpt, Comm& comm);

  // Collective. Takes over RUN_DIR/best of an earlier run when its file still exists (protected from retention).
  void load();
  // Local (the same verdict everywhere: every rank has the same agreed accuracy). Before this step's save: true
  // when `accuracy` beats the best so far; the checkpoint of `step` is then protected from retention from this
  // step's save on, and the old best released by it.
  bool offer(double accuracy, int64_t step);
  // Collective, after the step's save, when offer() said true: this step's checkpoint (saved through `save` unless
  // it already is) becomes the best once committed. If the save failed (--on-save-error continue), the previous
  // best stays and stays protected.
  void commit(const std::function<void()>& save);

  const std::string& file() const { return file_; }
  double accuracy() const { return accuracy_; }

 private:
  void write_pointer() const;

  std::string run_dir_;
  bool fsync_;
  Checkpointer& ckpt_;
  Comm& comm_;
  std::string file_;      // the best checkpoint's file name ("" none yet)
  double accuracy_ = -1;  // its accuracy
  double offered_ = -1;   // the accuracy offer() accepted, pending commit()
  std::vector<std::string> kept_before_;
};

}  // namespace h5ddp

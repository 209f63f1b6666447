// How the checkpoint layer's errors reach every rank (private to h5ddp_checkpoint): a rank's failure as the message
// Comm::rethrow_first agrees on, so that every rank raises it with the lowest failing rank's text.
#pragma once

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace h5ddp::ckpt {

// `message` without this process's leading "[host rank r/N] " tag (re-added once by whoever rethrows).
std::string strip_process_tag(const std::string& message);
// Runs f(), returning its exception message without the process tag ("" when it succeeded).
template <class F>
std::string capture_error(F&& f) {
  try {
    f();
    return {};
  } catch (const std::exception& e) {
    return strip_process_tag(e.what());
  }
}
// What this rank passes to Comm::rethrow_first, the one agreement helper ("agree, then throw"): null when
// `local_error` is empty, else a CheckpointError (CheckpointMismatchError with `mismatch`) carrying it, so that
// every rank raises the checkpoint layer's error type with the lowest failing rank's message. A message that
// starts with a process tag already (another rank's error, captured again) gets no second one.
std::exception_ptr checkpoint_error(const std::string& local_error, bool mismatch = false);
// Runs f(); its error (any exception) as checkpoint_error of its message, null when it succeeded:
// comm.rethrow_first(checkpoint_error_of([&] { ... })) so that no rank leaves a collective sequence alone.
template <class F>
std::exception_ptr checkpoint_error_of(F&& f) {
  return checkpoint_error(capture_error(std::forward<F>(f)));
}
// One message of several problems (each one line naming the file), or the one.
std::string joined_problems(const std::vector<std::string>& problems);

}  // namespace h5ddp::ckpt

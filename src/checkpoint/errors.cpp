#include "checkpoint/errors.hpp"

#include "h5ddp/error.hpp"

namespace h5ddp::ckpt {

std::string strip_process_tag(const std::string& message) {
  const std::string tag = process_tag() + " ";
  return message.compare(0, tag.size(), tag) == 0 ? message.substr(tag.size()) : message;
}

namespace {
// Whether `message` starts with some process's "[host rank r/N] " tag: another rank's error, raised here by
// Comm::rethrow_first, and captured again (e.g. by the asynchronous save's thread).
bool starts_with_process_tag(const std::string& message) {
  if (message.empty() || message[0] != '[') return false;
  const size_t end = message.find("] ");
  const size_t at = message.find(" rank ");
  return end != std::string::npos && at != std::string::npos && at < end && message.find('/', at) < end &&
         message.find(' ', 1) == at;
}
}  // namespace

std::exception_ptr checkpoint_error(const std::string& local_error, bool mismatch) {
  if (local_error.empty()) return nullptr;
  if (starts_with_process_tag(local_error)) {  // it names its rank already: no second tag
    if (mismatch) return std::make_exception_ptr(CheckpointMismatchError(Error::Untagged{}, local_error));
    return std::make_exception_ptr(CheckpointError(Error::Untagged{}, local_error));
  }
  if (mismatch) return std::make_exception_ptr(CheckpointMismatchError(local_error));
  return std::make_exception_ptr(CheckpointError(local_error));
}

std::string joined_problems(const std::vector<std::string>& problems) {
  if (problems.size() == 1) return problems[0];
  std::string out = std::to_string(problems.size()) + " problems (docs/FORMAT.md):";
  for (const auto& p : problems) out += "\n  " + p;
  return out;
}

}  // namespace h5ddp::ckpt

// h5ddp::Error for the libFuzzer builds, which compile tools/ckpt_torch/{pickle,zip_directory}.cpp alone:
// src/core/error.cpp also holds the MPI error helpers and would bring MPI into a sanitizer build.
#include "h5ddp/error.hpp"

namespace h5ddp {

Error::Error(const std::string& message) : std::runtime_error(message), message_(process_tag() + " " + message) {}
void Error::add_context(const std::string& context) {
  message_ += "\n  while " + context;
}
std::string process_tag() {
  return "[fuzz]";
}

}  // namespace h5ddp

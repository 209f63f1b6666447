#include "checkpoint/fault_inject.hpp"

#include <csignal>
#include <cstdlib>
#include <string>

#include "h5ddp/log.hpp"

namespace h5ddp::ckpt {

bool fault_armed(const char* phase, int rank) {
  // Armed only with H5DDP_TEST_HOOKS=1 as well, so a stray H5DDP_FAULT_INJECT in a production environment
  // (a copied job script, an exported shell variable) cannot harm a real run: it is ignored with a warning.
  static const std::string spec = [] {
    const char* e = std::getenv("H5DDP_FAULT_INJECT");
    if (e == nullptr || *e == '\0') return std::string();
    const char* armed = std::getenv("H5DDP_TEST_HOOKS");
    if (armed == nullptr || std::string(armed) != "1") {
      log::warn(std::string("ignoring H5DDP_FAULT_INJECT=") + e +
                ": a test-only hook, armed only with H5DDP_TEST_HOOKS=1");
      return std::string();
    }
    return std::string(e);
  }();
  if (spec.empty()) return false;
  const size_t colon = spec.find(':');
  if (spec.substr(0, colon) != phase) return false;
  const std::string who = colon == std::string::npos ? "all" : spec.substr(colon + 1);
  return who == "all" || who == std::to_string(rank);
}

void maybe_inject_fault(const char* phase, int rank) {
  if (fault_armed(phase, rank)) {
    log::warn(std::string("H5DDP_FAULT_INJECT: killing this rank at ") + phase);
    std::raise(SIGKILL);
  }
}

}  // namespace h5ddp::ckpt

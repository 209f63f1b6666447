// NCCL failures -> typed exceptions (CUDA builds only; see error.hpp for the macros).
#include <nccl.h>

#include <string>

#include "h5ddp/error.hpp"

namespace h5ddp::detail {
void throw_nccl_error(int code, const char* expr, const char* file, int line) {
  const char* text = ncclGetErrorString(static_cast<ncclResult_t>(code));
  std::string last;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  if (const char* l = ncclGetLastError(nullptr); l && *l) last = std::string("; ") + l;
#endif
  throw NcclError(std::string(expr) + " failed: " + (text ? text : "unknown NCCL error") + last +
                  source_location(file, line));
}

}  // namespace h5ddp::detail

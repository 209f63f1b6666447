// CUDA and NCCL failures -> typed exceptions (CUDA builds only; see error.hpp for the macros).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "h5ddp/error.hpp"

namespace h5ddp::detail {
namespace {
std::string where(const char* file, int line) {
  std::string f = file;
  const auto slash = f.find_last_of('/');
  return " (" + (slash == std::string::npos ? f : f.substr(slash + 1)) + ":" + std::to_string(line) + ")";
}
}  // namespace

void throw_cuda_error(int code, const char* expr, const char* file, int line) {
  const char* text = cudaGetErrorString(static_cast<cudaError_t>(code));
  throw CudaError(std::string(expr) + " failed: " + (text ? text : "unknown CUDA error") + " (code " +
                  std::to_string(code) + ")" + where(file, line));
}

void throw_nccl_error(int code, const char* expr, const char* file, int line) {
  const char* text = ncclGetErrorString(static_cast<ncclResult_t>(code));
  std::string last;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  if (const char* l = ncclGetLastError(nullptr); l && *l) last = std::string("; ") + l;
#endif
  throw NcclError(std::string(expr) + " failed: " + (text ? text : "unknown NCCL error") + last + where(file, line));
}

}  // namespace h5ddp::detail

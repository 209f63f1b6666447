// CUDA failures -> typed exceptions (CUDA builds only; see error.hpp for the macros).
#include <cuda_runtime_api.h>

#include <string>

#include "h5ddp/error.hpp"

namespace h5ddp::detail {
void throw_cuda_error(int code, const char* expr, const char* file, int line) {
  const char* text = cudaGetErrorString(static_cast<cudaError_t>(code));
  throw CudaError(std::string(expr) + " failed: " + (text ? text : "unknown CUDA error") + " (code " +
                  std::to_string(code) + ")" + source_location(file, line));
}
}  // namespace h5ddp::detail

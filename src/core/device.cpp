#include "h5ddp/device.hpp"

#ifdef H5DDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "h5ddp/error.hpp"

namespace h5ddp {

std::string DeviceChoice::describe() const {
  return cuda ? "cuda:" + std::to_string(index) : "cpu";
}

DeviceChoice choose_device(const std::string& requested, const DeviceFacts& f) {
  if (requested == "cpu") return DeviceChoice{};
  if (requested != "cuda" && requested != "auto")
    throw ConfigError("--device " + requested + ": unknown device (auto | cpu | cuda)");
  std::string why_not;
  if (!f.cuda_compiled)
    why_not = "this build has no CUDA (configure with -DH5DDP_WITH_CUDA=ON and a CUDA LibTorch in Torch_DIR)";
  else if (!f.torch_cuda)
    why_not =
        "the LibTorch in use has no CUDA (CPU-only; point Torch_DIR at a CUDA LibTorch, e.g. a pip torch's "
        "torch.utils.cmake_prefix_path)";
  else if (f.visible_gpus <= 0)
    why_not = "no GPU is visible to local rank " + std::to_string(f.local_rank) +
              " (check nvidia-smi, CUDA_VISIBLE_DEVICES, or srun --gpus-per-task=1)";
  else if (f.visible_gpus > 1 && f.local_size > f.visible_gpus)
    why_not = std::to_string(f.local_size) + " ranks on this node but " + std::to_string(f.visible_gpus) +
              " GPUs visible: NCCL needs one GPU per rank (start at most " + std::to_string(f.visible_gpus) +
              " ranks per node)";
  if (!why_not.empty()) {
    if (requested == "cuda") throw ConfigError("--device cuda: " + why_not);
    return DeviceChoice{};
  }
  return DeviceChoice{true, f.visible_gpus == 1 ? 0 : f.local_rank};
}

int visible_cuda_devices() {
#ifdef H5DDP_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

std::string cuda_device_bus_id(int index) {
#ifdef H5DDP_WITH_CUDA
  char id[64] = {};
  H5DDP_CHECK_CUDA(cudaDeviceGetPCIBusId(id, sizeof id, index));
  return id;
#else
  (void)index;
  return "";
#endif
}

void set_cuda_device(int index) {
#ifdef H5DDP_WITH_CUDA
  H5DDP_CHECK_CUDA(cudaSetDevice(index));
#else
  (void)index;
#endif
}

}  // namespace h5ddp

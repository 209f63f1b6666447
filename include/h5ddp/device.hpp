// Which device a rank trains on: the rule, kept pure so it is unit-tested without GPUs (tests/comm), and the
// facts it needs from this process. Torch-free.
//
//   --device cpu    the CPU
//   --device cuda   a GPU, or an error saying why not (CPU build, CPU-only LibTorch, no GPU visible, more
//                   ranks on a node than GPUs they can see)
//   --device auto   cuda when it is possible, else cpu
//
// Rank -> GPU: a rank that sees exactly one GPU takes it (srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set
// per rank); a rank that sees several takes the one at its local rank (mpirun on a multi-GPU node).
#pragma once

#include <string>

namespace h5ddp {

struct DeviceFacts {
  bool cuda_compiled = false;          // built with -DH5DDP_WITH_CUDA=ON (NCCL)
  bool torch_cuda = false;             // the LibTorch in use has CUDA (torch::cuda::is_available())
  int visible_gpus = 0;                // devices this process sees (CUDA_VISIBLE_DEVICES applied)
  int local_rank = 0, local_size = 1;  // among the ranks of this node
};

struct DeviceChoice {
  bool cuda = false;
  int index = -1;                // CUDA device ordinal among the visible ones; -1 for the CPU
  std::string describe() const;  // "cpu" or "cuda:1"
};

// Pure. Throws ConfigError naming what is missing for an impossible request; `requested` is auto|cpu|cuda.
DeviceChoice choose_device(const std::string& requested, const DeviceFacts& facts);

// Local. Visible CUDA devices (0 in CPU builds, or when the driver reports none or fails).
int visible_cuda_devices();

// Local. The PCI bus id of CUDA device `index` ("0000:3b:00.0"); "" in CPU builds. Ranks of one host compare
// them to find two ranks on one GPU (NCCL refuses that with a less clear error).
std::string cuda_device_bus_id(int index);

// Local. Makes `index` this thread's current CUDA device (no-op in CPU builds).
void set_cuda_device(int index);

}  // namespace h5ddp

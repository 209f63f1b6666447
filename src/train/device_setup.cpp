#include "train/device_setup.hpp"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "h5ddp/device.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/nccl_comm.hpp"  // declares NcclComm in CUDA builds only

namespace h5ddp {
namespace {

// Collective, the same verdict everywhere. Two ranks of one host on one GPU (each sees one GPU, the same one)
// would make NCCL fail later with a less clear error: compare "host bus-id" of every rank. A clash is an error
// with --device cuda; with auto the job trains on the CPU (false).
bool one_gpu_per_rank(const TrainConfig& config, Comm& comm, int index) {
  constexpr size_t kLen = 160;
  char mine[kLen] = {};
  char host[64] = {};
  ::gethostname(host, sizeof host - 1);
  std::snprintf(mine, kLen, "%s %s", host, cuda_device_bus_id(index).c_str());
  std::vector<char> all(kLen * static_cast<size_t>(comm.size()));
  comm.allgather(mine, all.data(), kLen, DType::kU8);
  std::string err;
  std::map<std::string, int> seen;  // "host bus" -> first rank
  for (int r = 0; r < comm.size() && err.empty(); ++r) {
    std::string tag(&all[kLen * r]);
    const std::string host_r = tag.substr(0, tag.find(' ')), bus = tag.substr(tag.rfind(' ') + 1);
    auto [it, fresh] = seen.emplace(host_r + " " + bus, r);
    if (!fresh)
      err = "--device cuda: ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " on " + host_r +
            " both got the GPU at " + bus + "; give each rank its own (srun --gpus-per-task=1, or fewer ranks)";
  }
  if (!err.empty() && config.device == "auto") {
    if (comm.rank() == 0)
      log::root_info("note: " + err.substr(err.find(':') + 2) + "; --device auto trains on the CPU");
    return false;
  }
  comm.raise_if_any(err);
  return true;
}

}  // namespace

DeviceSetup setup_device(const TrainConfig& config, Comm& comm, torch::nn::Module& module) {
  DeviceChoice choice = agreed(comm, [&] {
    DeviceFacts facts;
#ifdef H5DDP_WITH_CUDA
    facts.cuda_compiled = true;
#endif
    facts.torch_cuda = facts.cuda_compiled && torch::cuda::is_available();
    facts.visible_gpus = facts.torch_cuda ? visible_cuda_devices() : 0;
    facts.local_rank = config.local_rank;
    facts.local_size = config.local_size;
    return choose_device(config.device, facts);
  });
  int64_t all_cuda = choice.cuda ? 1 : 0;
  comm.allreduce(&all_cuda, 1, DType::kI64, ReduceOp::kSum);
  if (all_cuda != 0 && all_cuda != comm.size())
    comm.raise_if_any("--device " + config.device + ": " + std::to_string(all_cuda) + " of " +
                      std::to_string(comm.size()) +
                      " ranks have a usable GPU and the others not; pass --device cpu, or give every rank a GPU");
  if (choice.cuda) set_cuda_device(choice.index);
  if (choice.cuda && !one_gpu_per_rank(config, comm, choice.index)) choice = DeviceChoice{};  // auto: the CPU
  DeviceSetup out;
  if (choice.cuda) {
#ifdef H5DDP_WITH_CUDA
    out.device_comm = NcclComm::create(comm);
#endif
    out.compute.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(choice.index));
    module.to(out.compute.device);
  }
  out.compute.bf16 = config.bf16;
  if (comm.rank() == 0)
    log::root_info("device: " +
                   std::string(choice.cuda
                                   ? "cuda (one GPU per rank; rank 0 on " + choice.describe() + "), gradients over NCCL"
                                   : "cpu, gradients over MPI") +
                   ", precision " + (config.bf16 ? "bf16" : "fp32"));
  return out;
}

}  // namespace h5ddp

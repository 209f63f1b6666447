// h5ddp-train's --device and --precision: where each rank computes, and what carries its gradients.
#pragma once

#include <memory>

#include "h5ddp/comm.hpp"
#include "train/batch.hpp"
#include "train/config.hpp"

namespace h5ddp {

struct DeviceSetup {
  Compute compute;                    // the device the model and batches live on, bf16 autocast or not
  std::unique_ptr<Comm> device_comm;  // NcclComm for the gradients on CUDA; null on the CPU (MPI carries them)
};

// Collective (the same verdict everywhere). Every rank the same kind of device (h5ddp/device.hpp's rule), no two
// ranks of a host on one GPU (an error with --device cuda; with auto the job trains on the CPU); with CUDA an
// NcclComm for the gradients (MPI stays for control traffic) and `module` moved there. Rank 0 logs the choice.
DeviceSetup setup_device(const TrainConfig& config, Comm& comm, torch::nn::Module& module);

}  // namespace h5ddp

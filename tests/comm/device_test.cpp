// choose_device (h5ddp/device.hpp): the rank -> device rule with fake facts, so the GPU path's decisions are
// tested on machines without GPUs (issue 21).
#include "h5ddp/device.hpp"

#include <gtest/gtest.h>

#include <string>

#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

DeviceFacts gpus(int visible, int local_rank, int local_size) {
  DeviceFacts f;
  f.cuda_compiled = f.torch_cuda = true;
  f.visible_gpus = visible;
  f.local_rank = local_rank;
  f.local_size = local_size;
  return f;
}

std::string error_of(const std::string& requested, const DeviceFacts& f) {
  try {
    choose_device(requested, f);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ChooseDevice, CpuIsAlwaysCpu) {
  EXPECT_FALSE(choose_device("cpu", gpus(8, 3, 8)).cuda);
  EXPECT_EQ(choose_device("cpu", gpus(8, 3, 8)).describe(), "cpu");
}

TEST(ChooseDevice, ManyVisibleGpusTakeTheLocalRank) {  // mpirun on a 4-GPU node
  for (int r = 0; r < 4; ++r) {
    const DeviceChoice d = choose_device("cuda", gpus(4, r, 4));
    EXPECT_TRUE(d.cuda);
    EXPECT_EQ(d.index, r);
    EXPECT_EQ(choose_device("auto", gpus(4, r, 4)).index, r);
  }
  EXPECT_EQ(choose_device("cuda", gpus(8, 1, 2)).describe(), "cuda:1");  // fewer ranks than GPUs
}

TEST(ChooseDevice, OneVisibleGpuIsTaken) {  // srun --gpus-per-task=1: every rank sees its own GPU as device 0
  for (int r = 0; r < 4; ++r) EXPECT_EQ(choose_device("cuda", gpus(1, r, 4)).index, 0);
}

TEST(ChooseDevice, MoreRanksThanGpusIsAnErrorForCudaAndCpuForAuto) {
  const std::string e = error_of("cuda", gpus(2, 3, 4));
  EXPECT_NE(e.find("4 ranks on this node but 2 GPUs visible"), std::string::npos) << e;
  EXPECT_FALSE(choose_device("auto", gpus(2, 3, 4)).cuda);
}

TEST(ChooseDevice, MissingPiecesAreNamed) {
  DeviceFacts cpu_build;
  EXPECT_NE(error_of("cuda", cpu_build).find("-DH5DDP_WITH_CUDA=ON"), std::string::npos);
  DeviceFacts cpu_torch = gpus(2, 0, 2);
  cpu_torch.torch_cuda = false;
  EXPECT_NE(error_of("cuda", cpu_torch).find("LibTorch in use has no CUDA"), std::string::npos);
  EXPECT_NE(error_of("cuda", gpus(0, 1, 2)).find("no GPU is visible to local rank 1"), std::string::npos);
  for (const DeviceFacts& f : {cpu_build, cpu_torch, gpus(0, 0, 1)}) EXPECT_FALSE(choose_device("auto", f).cuda);
}

TEST(ChooseDevice, UnknownDeviceIsAnError) {
  EXPECT_NE(error_of("gpu", gpus(1, 0, 1)).find("unknown device"), std::string::npos);
}

TEST(ChooseDevice, ThisProcess) {  // a CPU-only machine or build: auto is the CPU, and asking for cuda says why not
  DeviceFacts here;
#ifdef H5DDP_WITH_CUDA
  here.cuda_compiled = true;
#endif
  here.visible_gpus = visible_cuda_devices();
  if (here.visible_gpus > 0) GTEST_SKIP() << "a GPU is visible: covered by the gpu-labelled tests";
  EXPECT_FALSE(choose_device("auto", here).cuda);
  EXPECT_FALSE(error_of("cuda", here).empty());
}

}  // namespace
}  // namespace h5ddp

// NcclComm on cudaMalloc'd buffers (label gpu: needs one GPU per rank; NCCL refuses two ranks on one GPU).
#include "h5ddp/nccl_comm.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "h5ddp/error.hpp"
#include "h5ddp_test/test_util.hpp"

namespace h5ddp {
namespace {

NcclComm& nccl() {
  static std::unique_ptr<NcclComm> c = [] {
    int n = 0;
    H5DDP_CHECK_CUDA(cudaGetDeviceCount(&n));
    int local = 0;
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    H5DDP_CHECK_CUDA(cudaSetDevice(local % n));
    return NcclComm::create(test::world());
  }();
  return *c;
}

struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : n(n) { H5DDP_CHECK_CUDA(cudaMalloc(&p, n * sizeof(float))); }
  ~DeviceBuffer() { cudaFree(p); }
  void put(const std::vector<float>& v) {
    H5DDP_CHECK_CUDA(cudaMemcpy(p, v.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  std::vector<float> get() const {
    std::vector<float> v(n);
    H5DDP_CHECK_CUDA(cudaDeviceSynchronize());
    H5DDP_CHECK_CUDA(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }
  float* p = nullptr;
  size_t n;
};

TEST(NcclComm, AllreduceOnDeviceBuffers) {
  auto& c = nccl();
  EXPECT_EQ(c.backend(), "nccl");
  EXPECT_EQ(c.size(), test::world().size());
  const size_t n = (size_t{1} << 20) + 3;
  DeviceBuffer b(n);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((c.rank() + 1) * (i % 7));
  b.put(v);
  c.allreduce(b.p, n, DType::kF32, ReduceOp::kSum);
  const float ranks_sum = c.size() * (c.size() + 1) / 2.0f;
  auto out = b.get();
  for (size_t i = 0; i < n; i += 997) ASSERT_EQ(out[i], ranks_sum * (i % 7)) << i;
}

TEST(NcclComm, GroupedAsyncAllreduces) {
  auto& c = nccl();
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<std::unique_ptr<Work>> works;
  for (int k = 0; k < 3; ++k) {
    bufs.push_back(std::make_unique<DeviceBuffer>(1000 * (k + 1)));
    bufs.back()->put(std::vector<float>(bufs.back()->n, static_cast<float>(c.rank() + k)));
  }
  c.group_start();
  for (auto& b : bufs) works.push_back(c.allreduce_async(b->p, b->n, DType::kF32, ReduceOp::kSum));
  EXPECT_FALSE(works.front()->test());  // not issued before group_end
  c.group_end();
  for (auto& w : works) w->wait();
  for (int k = 0; k < 3; ++k) {
    const float expect = c.size() * (c.size() - 1) / 2.0f + c.size() * k;
    auto out = bufs[k]->get();
    EXPECT_EQ(out.front(), expect);
    EXPECT_EQ(out.back(), expect);
  }
  for (auto& w : works) EXPECT_TRUE(w->test());
}

TEST(NcclComm, BroadcastAllgatherAndHostHelpers) {
  auto& c = nccl();
  DeviceBuffer b(64);
  b.put(std::vector<float>(64, static_cast<float>(c.rank() == 0 ? 42 : -1)));
  c.broadcast(b.p, 64, DType::kF32, 0);
  EXPECT_EQ(b.get()[63], 42.0f);

  DeviceBuffer mine(4), all(4 * c.size());
  mine.put(std::vector<float>(4, static_cast<float>(c.rank())));
  c.allgather(mine.p, all.p, 4, DType::kF32);
  auto g = all.get();
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(g[4 * r + 3], static_cast<float>(r));

  // Host buffers are staged: Comm's helpers work on an NcclComm too.
  EXPECT_TRUE(c.agree(12345));
  EXPECT_EQ(c.agree(static_cast<uint64_t>(c.rank())), c.size() == 1);
  c.barrier();
}

}  // namespace
}  // namespace h5ddp

// MpiComm::allreduce_async in each progress mode: results, ordering of many in-flight operations, errors
// surfacing in wait(), and Works dropped without wait() still completing.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "h5ddp/error.hpp"
#include "test_util.hpp"

namespace h5ddp {
namespace {

class AsyncModes : public testing::TestWithParam<MpiComm::AsyncMode> {};

TEST_P(AsyncModes, ManyInFlightAllreducesComplete) {
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  comm->set_async_mode(GetParam());
  const int n = comm->size(), r = comm->rank();
  std::vector<std::vector<float>> bufs;
  std::vector<std::unique_ptr<Work>> works;
  for (int k = 0; k < 12; ++k) bufs.emplace_back(size_t{1} << (4 + k), static_cast<float>(r + k));
  for (auto& b : bufs) works.push_back(comm->allreduce_async(b.data(), b.size(), DType::kF32, ReduceOp::kSum));
  // A blocking collective on the same MpiComm while the asynchronous ones are in flight.
  EXPECT_TRUE(comm->agree(42));
  for (auto& w : works) w->wait();
  for (auto& w : works) EXPECT_TRUE(w->test());
  for (int k = 0; k < 12; ++k) {
    const float expect = n * (n - 1) / 2.0f + static_cast<float>(n * k);
    EXPECT_EQ(bufs[k].front(), expect) << k;
    EXPECT_EQ(bufs[k].back(), expect) << k;
  }
}

TEST_P(AsyncModes, DroppedWorkStillCompletes) {
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  comm->set_async_mode(GetParam());
  std::vector<int64_t> v(1000, comm->rank());
  { auto w = comm->allreduce_async(v.data(), v.size(), DType::kI64, ReduceOp::kMax); }
  EXPECT_EQ(v[999], comm->size() - 1);
}

TEST_P(AsyncModes, UnsupportedDtypeThrowsBeforeCommunicating) {
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  comm->set_async_mode(GetParam());
  std::vector<uint16_t> half(8);
  EXPECT_THROW(comm->allreduce_async(half.data(), half.size(), DType::kF16, ReduceOp::kSum), Error);
  EXPECT_TRUE(comm->all_ok(true));
}

INSTANTIATE_TEST_SUITE_P(Mpi, AsyncModes,
                         testing::Values(MpiComm::AsyncMode::kNonBlocking, MpiComm::AsyncMode::kThread,
                                         MpiComm::AsyncMode::kProgress),
                         [](const auto& info) {
                           switch (info.param) {
                             case MpiComm::AsyncMode::kNonBlocking: return std::string("nonblocking");
                             case MpiComm::AsyncMode::kThread: return std::string("thread");
                             default: return std::string("progress");
                           }
                         });

TEST(MpiCommAsync, DefaultModeFromEnvironment) {
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  EXPECT_EQ(comm->async_mode(), MpiComm::default_async_mode());
}

}  // namespace
}  // namespace h5ddp

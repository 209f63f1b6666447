// MpiComm::allreduce_async (and reduce_scatter_async, allgatherv_async) in each progress mode: results, ordering of
// many in-flight operations, errors surfacing in wait(), and Works dropped without wait() still completing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "h5ddp/error.hpp"
#include "h5ddp_test/test_util.hpp"

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

// Buffers larger than H5DDP_MPI_REDUCE_CHUNK_BYTES go in several MPI calls; every rank must use rank 0's
// setting (here the others ask for a different one), or the ranks would call different collectives.
TEST_P(AsyncModes, ChunkedAllreducesUseRankZerosChunkSize) {
  int r0 = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r0);
  setenv("H5DDP_MPI_REDUCE_CHUNK_BYTES", r0 == 0 ? "12" : "4096", 1);
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  unsetenv("H5DDP_MPI_REDUCE_CHUNK_BYTES");
  comm->set_async_mode(GetParam());
  const int n = comm->size(), r = comm->rank();
  std::vector<float> a(1001), b(1001);  // 334 calls of 3 floats (rank 0's 12 bytes), the last one of 2
  std::vector<int64_t> c(7);            // 12 bytes = 1 int64 per call
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = static_cast<float>(i % 97 + r);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<int64_t>(i) * (r + 1);
  auto w = comm->allreduce_async(a.data(), a.size(), DType::kF32, ReduceOp::kSum);
  comm->allreduce(c.data(), c.size(), DType::kI64, ReduceOp::kMax);
  w->wait();
  comm->allreduce(b.data(), b.size(), DType::kF32, ReduceOp::kSum);
  for (size_t i = 0; i < a.size(); ++i) {
    const float expect = static_cast<float>(n * static_cast<int>(i % 97) + n * (n - 1) / 2);
    ASSERT_EQ(a[i], expect) << i;
    ASSERT_EQ(b[i], expect) << i;
  }
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], static_cast<int64_t>(i) * n) << i;
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

// Segments of different sizes (rank 0's empty when there are several ranks): after reduce_scatter_async rank r's
// segment holds the sum over ranks, in flight beside an allreduce_async (start order kept); allgatherv then hands
// every rank's segment to all ranks.
void check_segments(Comm& comm) {
  const int n = comm.size(), r = comm.rank();
  std::vector<size_t> counts(n);
  for (int k = 0; k < n; ++k) counts[k] = k == 0 && n > 1 ? 0 : 100 * k + 7;
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<size_t> offset(n, 0);
  for (int k = 1; k < n; ++k) offset[k] = offset[k - 1] + counts[k - 1];
  std::vector<double> buf(total), other(33, r);
  for (size_t i = 0; i < total; ++i) buf[i] = 0.5 * static_cast<double>(i) + r;
  auto w1 = comm.allreduce_async(other.data(), other.size(), DType::kF64, ReduceOp::kSum);
  auto w2 = comm.reduce_scatter_async(buf.data(), counts, DType::kF64, ReduceOp::kSum);
  w2->wait();
  w1->wait();
  for (size_t i = offset[r]; i < offset[r] + counts[r]; ++i)
    ASSERT_EQ(buf[i], n * 0.5 * static_cast<double>(i) + n * (n - 1) / 2.0) << i;
  EXPECT_EQ(other[32], n * (n - 1) / 2.0);
  std::vector<float> g(total, -1.0f);
  for (size_t i = 0; i < counts[r]; ++i) g[offset[r] + i] = static_cast<float>(r + 1);
  comm.allgatherv(g.data(), counts, DType::kF32);
  for (int k = 0; k < n; ++k)
    for (size_t i = 0; i < counts[k]; ++i) ASSERT_EQ(g[offset[k] + i], static_cast<float>(k + 1)) << k << " " << i;
}

TEST_P(AsyncModes, ReduceScatterAndAllgathervBySegment) {
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  comm->set_async_mode(GetParam());
  check_segments(*comm);
}

// allgatherv_async gives what the blocking allgatherv gives, for uneven segments with empty ones (a rank with no
// rows of a small parameter), all segments empty, and equal ones; several in flight at once beside a
// reduce_scatter_async and a blocking collective, started in the same order on every rank; a Work dropped without
// wait() still completes.
void check_allgatherv_async(Comm& comm) {
  const int n = comm.size(), r = comm.rank();
  const std::vector<std::vector<size_t>> patterns = [&] {
    std::vector<size_t> uneven(n), zeros(n, 0), equal(n, 5), last_only(n, 0);
    for (int k = 0; k < n; ++k) uneven[k] = k % 2 == 1 ? 0 : 37 * k + 3;  // odd ranks empty (rank 0 not)
    last_only[n - 1] = 11;
    return std::vector<std::vector<size_t>>{uneven, zeros, equal, last_only};
  }();
  const auto fill = [&](const std::vector<size_t>& counts, int salt) {
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    std::vector<double> buf(total, -1.0);  // the other ranks' segments: garbage until gathered
    size_t offset = std::accumulate(counts.begin(), counts.begin() + r, size_t{0});
    for (size_t i = 0; i < counts[r]; ++i) buf[offset + i] = 1000.0 * r + static_cast<double>(i) + 0.25 * salt;
    return buf;
  };
  std::vector<std::vector<double>> async_bufs, blocking_bufs;
  for (size_t p = 0; p < patterns.size(); ++p) {
    async_bufs.push_back(fill(patterns[p], static_cast<int>(p)));
    blocking_bufs.push_back(fill(patterns[p], static_cast<int>(p)));
  }
  std::vector<double> scattered(static_cast<size_t>(4 * n), 1.0);
  std::vector<std::unique_ptr<Work>> works;
  for (size_t p = 0; p < patterns.size(); ++p) {
    works.push_back(comm.allgatherv_async(async_bufs[p].data(), patterns[p], DType::kF64));
    if (p == 1)
      works.push_back(
          comm.reduce_scatter_async(scattered.data(), std::vector<size_t>(n, 4), DType::kF64, ReduceOp::kSum));
  }
  EXPECT_TRUE(comm.agree(7));  // a blocking collective while they are in flight
  for (size_t p = 0; p < patterns.size(); ++p) comm.allgatherv(blocking_bufs[p].data(), patterns[p], DType::kF64);
  for (auto& w : works) w->wait();
  for (auto& w : works) EXPECT_TRUE(w->test());
  for (size_t p = 0; p < patterns.size(); ++p) {
    ASSERT_EQ(async_bufs[p], blocking_bufs[p]) << "pattern " << p;
    size_t offset = 0;
    for (int k = 0; k < n; ++k)
      for (size_t i = 0; i < patterns[p][k]; ++i, ++offset)
        ASSERT_EQ(async_bufs[p][offset], 1000.0 * k + static_cast<double>(i) + 0.25 * static_cast<double>(p))
            << "pattern " << p << " rank " << k << " element " << i;
  }
  for (size_t i = 4 * static_cast<size_t>(r); i < 4 * static_cast<size_t>(r) + 4; ++i)
    EXPECT_EQ(scattered[i], static_cast<double>(n));
  std::vector<int64_t> dropped(static_cast<size_t>(n), -1);
  dropped[r] = r;
  { auto w = comm.allgatherv_async(dropped.data(), std::vector<size_t>(n, 1), DType::kI64); }
  for (int k = 0; k < n; ++k) EXPECT_EQ(dropped[k], k);
}

TEST_P(AsyncModes, AllgathervAsyncEqualsAllgatherv) {
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  comm->set_async_mode(GetParam());
  check_allgatherv_async(*comm);
}

// Comm's own reduce_scatter_async and allgatherv (what a backend without them, e.g. NcclComm, runs): a Comm that
// forwards only the required operations to an MpiComm.
class ForwardingComm final : public Comm {
 public:
  explicit ForwardingComm(Comm& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::string backend() const override { return "forwarding"; }
  void broadcast(void* buf, size_t count, DType dtype, int root) override { c_.broadcast(buf, count, dtype, root); }
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override { c_.allreduce(buf, count, dtype, op); }
  std::unique_ptr<Work> allreduce_async(void* buf, size_t count, DType dtype, ReduceOp op) override {
    return c_.allreduce_async(buf, count, dtype, op);
  }
  void allgather(const void* send, void* recv, size_t count, DType dtype) override {
    c_.allgather(send, recv, count, dtype);
  }
  void barrier() override { c_.barrier(); }

 private:
  Comm& c_;
};

TEST(CommDefaults, ReduceScatterAndAllgathervBySegment) {
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  ForwardingComm forwarding(*comm);
  check_segments(forwarding);
}

TEST(CommDefaults, AllgathervAsyncIsTheBlockingOneCompleted) {
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  ForwardingComm forwarding(*comm);
  check_allgatherv_async(forwarding);
}

INSTANTIATE_TEST_SUITE_P(Mpi, AsyncModes,
                         testing::Values(MpiComm::AsyncMode::kNonBlocking, MpiComm::AsyncMode::kThread,
                                         MpiComm::AsyncMode::kProgress),
                         [](const auto& info) {
                           switch (info.param) {
                             case MpiComm::AsyncMode::kNonBlocking:
                               return std::string("nonblocking");
                             case MpiComm::AsyncMode::kThread:
                               return std::string("thread");
                             default:
                               return std::string("progress");
                           }
                         });

// Ranks asking for different modes (rank 0 "thread", the others "progress") all get rank 0's.
TEST(MpiCommAsync, DefaultModeIsRankZerosEverywhere) {
  int r0 = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r0);
  const char* saved = std::getenv("H5DDP_MPI_ASYNC");
  const std::string keep = saved ? saved : "";
  setenv("H5DDP_MPI_ASYNC", r0 == 0 ? "thread" : "progress", 1);
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  if (saved)
    setenv("H5DDP_MPI_ASYNC", keep.c_str(), 1);
  else
    unsetenv("H5DDP_MPI_ASYNC");
  EXPECT_EQ(comm->async_mode(), MpiComm::AsyncMode::kThread);
  int mode = static_cast<int>(comm->async_mode());
  int lo = mode, hi = mode;
  MPI_Allreduce(&mode, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mode, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
}

TEST(MpiCommAsync, DefaultModeByCoresPerRank) {
  using M = MpiComm::AsyncMode;
  const char* saved = std::getenv("H5DDP_MPI_ASYNC");
  const std::string keep = saved ? saved : "";
  unsetenv("H5DDP_MPI_ASYNC");
  EXPECT_EQ(MpiComm::default_async_mode(2, 2), M::kProgress);  // one core per rank: no core to spin on
  EXPECT_EQ(MpiComm::default_async_mode(2, 3), M::kProgress);
  EXPECT_EQ(MpiComm::default_async_mode(2, 4), M::kThread);  // a spare core per rank
  EXPECT_EQ(MpiComm::default_async_mode(4, 2), M::kThread);  // oversubscribed
  EXPECT_EQ(MpiComm::default_async_mode(1, 1), M::kProgress);
  setenv("H5DDP_MPI_ASYNC", "nonblocking", 1);
  EXPECT_EQ(MpiComm::default_async_mode(4, 2), M::kNonBlocking);
  setenv("H5DDP_MPI_ASYNC", "sideways", 1);
  EXPECT_THROW(MpiComm::default_async_mode(4, 2), ConfigError);
  if (saved)
    setenv("H5DDP_MPI_ASYNC", keep.c_str(), 1);
  else
    unsetenv("H5DDP_MPI_ASYNC");
}

}  // namespace
}  // namespace h5ddp

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "h5ddp/error.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp_test/test_util.hpp"

using namespace h5ddp;

// MpiEnv (made by this binary's main before any test) excludes Open MPI's openib BTL unless the launcher
// chose BTLs (OMPI_MCA_btl) or H5DDP_KEEP_OPENIB is set; ctest sets neither for this binary (tests/comm).
TEST(MpiEnvSetup, OpenibBtlExcludedWhenNobodyChoseBtls) {
  if (std::getenv("H5DDP_KEEP_OPENIB")) GTEST_SKIP() << "H5DDP_KEEP_OPENIB is set";
  const char* btl = std::getenv("OMPI_MCA_btl");
  ASSERT_NE(btl, nullptr);
  EXPECT_STREQ(btl, "^openib");
}

TEST(Comm, AllreduceSumMinMax) {
  auto& c = test::world();
  std::vector<float> v(1000, static_cast<float>(c.rank() + 1));
  c.allreduce(v.data(), v.size(), DType::kF32, ReduceOp::kSum);
  const float expect = c.size() * (c.size() + 1) / 2.0f;
  for (float x : v) ASSERT_EQ(x, expect);
  int64_t r = c.rank();
  c.allreduce(&r, 1, DType::kI64, ReduceOp::kMax);
  EXPECT_EQ(r, c.size() - 1);
}

TEST(Comm, AsyncAllreduceMatchesBlocking) {
  auto& c = test::world();
  std::vector<double> a(4096), b(4096);
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = (c.rank() + 1) * 0.5 + i;
  auto w = c.allreduce_async(a.data(), a.size(), DType::kF64, ReduceOp::kSum);
  c.allreduce(b.data(), b.size(), DType::kF64, ReduceOp::kSum);
  while (!w->test()) {
  }
  w->wait();
  EXPECT_EQ(a, b);
}

// Waiting that sleeps between tests (chosen on oversubscribed nodes, or by H5DDP_MPI_WAIT) gives the same
// sums in every async mode; a bad H5DDP_MPI_WAIT is a ConfigError.
TEST(Comm, SleepingWaitsGiveTheSameResultsInEveryMode) {
  for (const char* wait : {"sleep", "spin"}) {
    setenv("H5DDP_MPI_WAIT", wait, 1);
    auto c = MpiComm::dup(MPI_COMM_WORLD);
    EXPECT_EQ(c->sleeps_while_waiting(), std::string(wait) == "sleep");
    for (auto mode : {MpiComm::AsyncMode::kNonBlocking, MpiComm::AsyncMode::kProgress, MpiComm::AsyncMode::kThread}) {
      c->set_async_mode(mode);
      std::vector<float> v(100000, static_cast<float>(c->rank() + 1));
      auto w = c->allreduce_async(v.data(), v.size(), DType::kF32, ReduceOp::kSum);
      w->wait();
      const float expect = c->size() * (c->size() + 1) / 2.0f;
      for (float x : v) ASSERT_EQ(x, expect) << wait << " mode " << static_cast<int>(mode);
    }
  }
  setenv("H5DDP_MPI_WAIT", "bogus", 1);
  EXPECT_THROW(MpiComm::dup(MPI_COMM_WORLD), ConfigError);
  unsetenv("H5DDP_MPI_WAIT");
}

TEST(Comm, BroadcastAndAllgather) {
  auto& c = test::world();
  std::vector<int32_t> v(10, c.rank() == 0 ? 42 : -1);
  c.broadcast(v.data(), v.size(), DType::kI32, 0);
  for (int32_t x : v) EXPECT_EQ(x, 42);
  int32_t mine = 7 * c.rank();
  std::vector<int32_t> all(c.size());
  c.allgather(&mine, all.data(), 1, DType::kI32);
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(all[r], 7 * r);
  EXPECT_EQ(c.broadcast_string(c.rank() == 0 ? "hello" : "", 0), "hello");
}

TEST(Comm, AgreeDetectsDisagreement) {
  auto& c = test::world();
  EXPECT_TRUE(c.agree(123));
  EXPECT_EQ(c.agree(c.rank() == c.size() - 1 ? 124 : 123), c.size() == 1);
  EXPECT_TRUE(c.all_ok(true));
  EXPECT_EQ(c.all_ok(c.rank() != 0), false);
}

TEST(Comm, RaiseIfAnyThrowsOnEveryRankWithTheFailingRank) {
  auto& c = test::world();
  const int bad = c.size() - 1;
  try {
    c.raise_if_any(c.rank() == bad ? "disk on fire" : "");
    ADD_FAILURE() << "expected DisagreementError";
  } catch (const DisagreementError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("rank " + std::to_string(bad) + " reported: disk on fire"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(c.raise_if_any(""));
}

// agreed(): the lowest failing rank's error, of its own type and with its message (naming that rank), on every
// rank, marked agreed; the value of f() when no rank failed.
TEST(Comm, AgreedRethrowsTheLowestFailingRanksErrorEverywhere) {
  auto& c = test::world();
  EXPECT_EQ(agreed(c, [&] { return c.rank() + 40; }), c.rank() + 40);
  const int bad = c.size() - 1;
  try {
    agreed(c, [&] {
      if (c.rank() == bad) throw ConfigError("--batch-size 7: not divisible");
      if (c.rank() > bad) throw DataError("never the lowest");
    });
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(e.agreed());
    EXPECT_NE(msg.find("rank " + std::to_string(bad) + "/" + std::to_string(c.size()) + "] --batch-size 7"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("rank " + std::to_string(bad) + "/", msg.find("/") + 1), std::string::npos)
        << "the rank is named once: " << msg;
  }
  try {
    agreed(c, [&] {
      if (c.rank() == 0) throw CheckpointMismatchError("another model");
    });
    ADD_FAILURE() << "expected CheckpointMismatchError";
  } catch (const CheckpointMismatchError& e) {
    EXPECT_TRUE(e.agreed());
  }
  try {  // anything else: an h5ddp::Error with its text
    agreed(c, [&] {
      if (c.rank() == bad) throw std::runtime_error("plain failure");
    });
    ADD_FAILURE() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plain failure"), std::string::npos) << e.what();
    EXPECT_EQ(dynamic_cast<const ConfigError*>(&e), nullptr);
  }
}

TEST(Comm, RequireSameListsValues) {
  auto& c = test::world();
  EXPECT_NO_THROW(c.require_same(5, "step"));
  if (c.size() == 1) return;
  try {
    c.require_same(c.rank() == 0 ? 100 : 200, "checkpoint step");
    ADD_FAILURE() << "expected DisagreementError";
  } catch (const DisagreementError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("ranks disagree on checkpoint step"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0=100"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1=200"), std::string::npos) << msg;
  }
}

TEST(Error, MessageCarriesRankAndContext) {
  try {
    with_context("writing /model/x to f.h5", [] { throw CheckpointError("bad bytes"); });
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("rank " + std::to_string(test::world().rank())), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad bytes"), std::string::npos);
    EXPECT_NE(msg.find("while writing /model/x to f.h5"), std::string::npos);
  }
}

TEST(Error, MpiErrorsThrowInsteadOfAborting) {
  int bogus_root = test::world().size() + 5;
  int x = 0;
  EXPECT_THROW(H5DDP_CHECK_MPI(MPI_Bcast(&x, 1, MPI_INT, bogus_root, test::world().handle())), MpiError);
}

// In-process fault tests (issue 9) that need no subprocess: the watchdog with a non-aborting stall handler
// (the aborting path is tested end to end by tests/faults/watchdog_test.py), loading a checkpoint of
// another model, and ranks that disagree at a save.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/watchdog.hpp"
#include "h5ddp_test/checkpoint_fixture.hpp"
#include "h5ddp_test/test_util.hpp"

namespace h5ddp {
namespace {

using namespace std::chrono_literals;

struct Recorder {
  std::mutex m;
  std::vector<std::string> messages;
  Watchdog::StallHandler handler() {
    return [this](const std::string& msg) {
      std::lock_guard<std::mutex> lock(m);
      messages.push_back(msg);
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(m);
    return messages.size();
  }
};

// --watchdog-seconds auto: the limit follows the slowest operation seen, never below the floor.
TEST(AutoLimit, FloorUntilTheSlowestTimesTheFactorExceedsIt) {
  AutoLimit limit(300, 20);
  EXPECT_EQ(limit.seconds(), 300);  // nothing measured yet
  limit.observe(0.5);
  EXPECT_EQ(limit.seconds(), 300);  // 20 x 0.5 s < 300 s
  limit.observe(30);
  EXPECT_EQ(limit.seconds(), 600);  // 20 x 30 s
  limit.observe(2);                 // a faster step does not lower it
  EXPECT_EQ(limit.seconds(), 600);
  EXPECT_EQ(limit.slowest(), 30);
  EXPECT_GE(kAutoWatchdogStepFloor, 60);  // "generous": a stall is reported, a busy machine is not
  EXPECT_GE(kAutoWatchdogSaveFloor, kAutoWatchdogStepFloor);
}

TEST(Watchdog, DisabledNeverFires) {
  Recorder rec;
  Watchdog wd(0, rec.handler());
  EXPECT_FALSE(wd.enabled());
  {
    auto g = wd.guard("anything", 0.01);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(rec.count(), 0u);
}

TEST(Watchdog, CompletedOperationDoesNotFire) {
  Recorder rec;
  // 2 s: a barrier of 4 oversubscribed ranks on a machine at a load of 8 can take a good part of a second.
  Watchdog wd(2, rec.handler());
  for (int i = 0; i < 20; ++i) {
    auto g = wd.guard("allreduce " + std::to_string(i));
    test::world().barrier();
  }
  std::this_thread::sleep_for(2500ms);  // past every deadline: all guards were released in time
  EXPECT_EQ(rec.count(), 0u);
  EXPECT_EQ(wd.stalls(), 0);
}

TEST(Watchdog, StalledOperationFiresOnceWithMessage) {
  Recorder rec;
  Watchdog wd(0.1, rec.handler());
  const auto t0 = std::chrono::steady_clock::now();
  {
    auto g = wd.guard("allreduce of step flags at step 7");
    while (rec.count() == 0 && std::chrono::steady_clock::now() - t0 < 30s) std::this_thread::sleep_for(5ms);
    std::this_thread::sleep_for(150ms);  // longer than another period: must not be reported twice
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(rec.count(), 1u);
  EXPECT_LT(waited, 20.0);  // fired, and not only when the test gave up waiting (load-tolerant bound)
  const std::string& msg = rec.messages[0];
  EXPECT_NE(msg.find("allreduce of step flags at step 7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has not completed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank " + std::to_string(test::world().rank())), std::string::npos) << msg;
}

TEST(Watchdog, NestedGuardsReportTheStalledOne) {
  Recorder rec;
  Watchdog wd(10, rec.handler());
  {
    auto outer = wd.guard("step 3");  // 10 s: does not fire
    {
      auto inner = wd.guard("save of ckpt-3", 0.05);
      const auto t0 = std::chrono::steady_clock::now();
      while (rec.count() == 0 && std::chrono::steady_clock::now() - t0 < 30s) std::this_thread::sleep_for(5ms);
    }
  }
  ASSERT_EQ(rec.count(), 1u);
  EXPECT_NE(rec.messages[0].find("save of ckpt-3"), std::string::npos);
  EXPECT_EQ(rec.messages[0].find("step 3'"), std::string::npos);
}

TEST(Watchdog, GuardMoveAndEarlyRelease) {
  Recorder rec;
  Watchdog wd(1, rec.handler());  // long enough that a busy machine never fires the released guard
  Watchdog::Guard kept;
  {
    auto g = wd.guard("moved");
    kept = std::move(g);
  }  // the moved-from guard's scope ends: the operation is still armed in `kept`
  kept.release();
  kept.release();
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(rec.count(), 0u);
  {
    auto g = wd.guard("moved and held");
    Watchdog::Guard other(std::move(g));
    const auto t0 = std::chrono::steady_clock::now();
    while (rec.count() == 0 && std::chrono::steady_clock::now() - t0 < 30s) std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(rec.count(), 1u);
}

TEST(Watchdog, GuardsFromManyThreads) {
  Recorder rec;
  Watchdog wd(10, rec.handler());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&wd, t] {
      for (int i = 0; i < 200; ++i) auto g = wd.guard("thread " + std::to_string(t));
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(rec.count(), 0u);
}

}  // namespace
}  // namespace h5ddp

// ---- checkpoints of another model, ranks that disagree (issue 9) ---------------------------------------

namespace h5ddp {
namespace {

namespace fs = std::filesystem;
using test::OwnedState;
using test::TensorSpec;

// Files left in `dir` (names only), same list on every rank.
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Runs f on every rank; returns the exception message ("" if none) and checks every rank threw E.
template <class E, class F>
std::string expect_throw_everywhere(F&& f) {
  std::string msg;
  bool threw = false;
  try {
    f();
  } catch (const E& e) {
    threw = true;
    msg = e.what();
  }
  EXPECT_TRUE(threw) << "rank " << test::world().rank() << " did not throw";
  EXPECT_TRUE(test::world().all_ok(threw)) << "some rank did not throw";
  return msg;
}

TEST(CheckpointOfAnotherModel, OneErrorListsEveryDifference) {
  auto& comm = test::world();
  const std::string dir = test::scratch_dir("faults-mismatch");
  OwnedState saved(11, comm.rank());
  const SaveResult r = save_checkpoint(comm, saved.state, dir);

  // The loading model: conv1.bias missing, extra.weight extra, fc.weight reshaped, ids widened.
  std::vector<TensorSpec> model;
  for (auto s : test::model_specs()) {
    if (s.name == "conv1.bias") continue;
    if (s.name == "fc.weight") s.shape = {5, 3};
    if (s.name == "ids") s.dtype = DType::kI64;
    model.push_back(s);
  }
  model.push_back({"extra.weight", DType::kF32, {2, 2}});
  OwnedState target(11, comm.rank(), false, model);
  const std::string msg =
      expect_throw_everywhere<CheckpointError>([&] { load_checkpoint(comm, r.path, target.state); });
  for (const char* name : {"conv1.bias", "extra.weight", "fc.weight", "ids"})
    EXPECT_NE(msg.find(name), std::string::npos) << "difference '" << name << "' not listed in:\n" << msg;
  EXPECT_NE(msg.find(r.path), std::string::npos) << "file not named in:\n" << msg;
  EXPECT_NE(msg.find("rank"), std::string::npos) << msg;
  comm.barrier();
  if (comm.rank() == 0) fs::remove_all(dir);
}

TEST(RanksThatDisagree, DifferentStepFailsEverywhereWithoutFile) {
  auto& comm = test::world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::scratch_dir("faults-step");
  OwnedState s(1, comm.rank());
  s.state.counters.step = 100 + (comm.rank() == comm.size() - 1 ? 1 : 0);
  const std::string msg = expect_throw_everywhere<Error>([&] { save_checkpoint(comm, s.state, dir); });
  EXPECT_NE(msg.find("step"), std::string::npos) << msg;
  comm.barrier();
  EXPECT_TRUE(files_in(dir).empty()) << "a disagreement left files behind";
  comm.barrier();
  if (comm.rank() == 0) fs::remove_all(dir);
}

TEST(RanksThatDisagree, DifferentModelFailsEverywhereWithoutFile) {
  auto& comm = test::world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::scratch_dir("faults-model");
  auto specs = test::model_specs();
  if (comm.rank() == comm.size() - 1) specs.push_back({"only.here", DType::kF32, {3}});
  OwnedState s(2, comm.rank(), true, specs);
  expect_throw_everywhere<Error>([&] { save_checkpoint(comm, s.state, dir); });
  comm.barrier();
  EXPECT_TRUE(files_in(dir).empty()) << "a disagreement left files behind";
  comm.barrier();
  if (comm.rank() == 0) fs::remove_all(dir);
}

TEST(RanksThatDisagree, DifferentReplicaBytesFailEverywhere) {
  auto& comm = test::world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::scratch_dir("faults-replica");
  OwnedState s(3, comm.rank());
  if (comm.rank() == comm.size() - 1) static_cast<uint8_t*>(s.find("fc.weight")->data)[5] ^= 0x40;
  const std::string msg = expect_throw_everywhere<Error>([&] { save_checkpoint(comm, s.state, dir); });
  EXPECT_NE(msg.find("fc.weight"), std::string::npos) << msg;
  comm.barrier();
  EXPECT_TRUE(files_in(dir).empty()) << "a disagreement left files behind";
  comm.barrier();
  if (comm.rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace h5ddp

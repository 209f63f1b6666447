// In-process tests of the fault-handling pieces that need no subprocess: the watchdog with a
// non-aborting stall handler. (The aborting path is tested end to end by tests/faults/watchdog_test.py.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "h5ddp/watchdog.hpp"
#include "test_util.hpp"

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
  Watchdog wd(0.2, rec.handler());
  for (int i = 0; i < 20; ++i) {
    auto g = wd.guard("allreduce " + std::to_string(i));
    test::world().barrier();
  }
  std::this_thread::sleep_for(300ms);  // past every deadline: all guards were released in time
  EXPECT_EQ(rec.count(), 0u);
  EXPECT_EQ(wd.stalls(), 0);
}

TEST(Watchdog, StalledOperationFiresOnceWithMessage) {
  Recorder rec;
  Watchdog wd(0.1, rec.handler());
  const auto t0 = std::chrono::steady_clock::now();
  {
    auto g = wd.guard("allreduce of step flags at step 7");
    while (rec.count() == 0 && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(5ms);
    std::this_thread::sleep_for(150ms);  // longer than another period: must not be reported twice
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(rec.count(), 1u);
  EXPECT_LT(waited, 2.0);
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
      while (rec.count() == 0 && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(5ms);
    }
  }
  ASSERT_EQ(rec.count(), 1u);
  EXPECT_NE(rec.messages[0].find("save of ckpt-3"), std::string::npos);
  EXPECT_EQ(rec.messages[0].find("step 3'"), std::string::npos);
}

TEST(Watchdog, GuardMoveAndEarlyRelease) {
  Recorder rec;
  Watchdog wd(0.05, rec.handler());
  Watchdog::Guard kept;
  {
    auto g = wd.guard("moved");
    kept = std::move(g);
  }  // the moved-from guard's scope ends: the operation is still armed in `kept`
  kept.release();
  kept.release();
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(rec.count(), 0u);
  {
    auto g = wd.guard("moved and held");
    Watchdog::Guard other(std::move(g));
    const auto t0 = std::chrono::steady_clock::now();
    while (rec.count() == 0 && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(rec.count(), 1u);
}

TEST(Watchdog, GuardsFromManyThreads) {
  Recorder rec;
  Watchdog wd(1.0, rec.handler());
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

// AsyncCheckpointer (issue 8): same bytes as a synchronous save, the snapshot is taken at start() (later
// changes to the state do not leak into the file), buffers are reused, at most one save in flight, and a
// background failure throws on every rank at the next poll()/wait().
#include "checkpoint/async_checkpoint.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/run_dir.hpp"
#include "h5ddp_test/checkpoint_fixture.hpp"
#include "h5ddp_test/test_util.hpp"

namespace h5ddp {
namespace {

namespace fs = std::filesystem;
using test::OwnedState;

// Every tensor of `path` loaded into a fresh state shaped like the fixture.
void load_into(const std::string& path, OwnedState& dst) {
  LoadOptions lo;
  load_checkpoint(test::world(), path, dst.state, lo);
}

void scribble(OwnedState& s) {
  for (auto& t : s.state.model)
    if (t.nbytes()) std::memset(t.data, 0xA5, t.nbytes());
  for (auto& t : s.state.optimizer.state)
    if (t.nbytes()) std::memset(t.data, 0x5A, t.nbytes());
  s.state.counters.step += 1000;
}

TEST(AsyncCheckpoint, SameBytesAsSyncAndSnapshotAtStart) {
  auto& comm = test::world();
  const std::string dir = test::scratch_dir("async-same");
  OwnedState src(7, comm.rank());
  OwnedState reference(7, comm.rank());  // pristine copy to compare against
  SaveOptions so;
  so.name = "sync.h5";
  SaveResult sync = save_checkpoint(comm, src.state, dir, so);

  AsyncCheckpointer async(comm);
  so.name = "async.h5";
  async.start(src.state, dir, so);
  EXPECT_TRUE(async.in_flight());
  scribble(src);  // training goes on: the file must hold the values at start()
  SaveResult ar = async.wait();
  EXPECT_FALSE(async.in_flight());
  EXPECT_EQ(ar.path, dir + "/async.h5");
  EXPECT_EQ(ar.bytes, sync.bytes);

  CheckpointManifest ms = read_manifest(comm, sync.path), ma = read_manifest(comm, ar.path);
  EXPECT_EQ(ms.step, ma.step);
  ASSERT_EQ(ms.model.size(), ma.model.size());
  for (size_t i = 0; i < ms.model.size(); ++i) {
    EXPECT_EQ(ms.model[i].name, ma.model[i].name);
    EXPECT_EQ(ms.model[i].checksum, ma.model[i].checksum) << ms.model[i].name;
  }
  ASSERT_EQ(ms.optimizer_state.size(), ma.optimizer_state.size());
  for (size_t i = 0; i < ms.optimizer_state.size(); ++i)
    EXPECT_EQ(ms.optimizer_state[i].checksum, ma.optimizer_state[i].checksum) << ms.optimizer_state[i].name;

  OwnedState from_sync(7, comm.rank(), false), from_async(7, comm.rank(), false);
  load_into(sync.path, from_sync);
  load_into(ar.path, from_async);
  EXPECT_TRUE(test::differing_tensors(from_sync.state, from_async.state).empty());
  EXPECT_TRUE(test::differing_tensors(reference.state, from_async.state).empty());
  EXPECT_EQ(from_async.state.counters.step, reference.state.counters.step);
  EXPECT_EQ(from_async.state.rng_by_rank.size(), static_cast<size_t>(comm.size()));
  if (comm.rank() == 0) {
    EXPECT_TRUE(verify_checkpoint_file(ar.path).ok);
    EXPECT_TRUE(fs::is_symlink(dir + "/latest") || fs::exists(dir + "/latest"));
  }
  comm.barrier();
  if (comm.rank() == 0) fs::remove_all(dir);
}

TEST(AsyncCheckpoint, BuffersReusedAndOneSaveInFlight) {
  auto& comm = test::world();
  const std::string dir = test::scratch_dir("async-reuse");
  OwnedState src(3, comm.rank());
  AsyncCheckpointer async(comm);
  SaveOptions so;
  so.retention.keep_last = 0;
  for (int i = 0; i < 4; ++i) {
    src.state.counters.step = 10 + i;
    async.start(src.state, dir, so);  // waits for the previous one: never two in flight
    if (i % 2 == 0) continue;         // the next start() must wait for this one
    // The trainer's pattern: poll while in flight. in_flight() must flip on every rank in the same poll,
    // or ranks would stop entering poll()'s allreduce at different steps (a hang, caught by the timeout).
    while (async.in_flight()) {
      async.poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  SaveResult last = async.wait();
  EXPECT_EQ(async.buffer_allocations(), 1);
  EXPECT_GE(async.buffer_bytes(), async.last_timing().bytes_copied);
  EXPECT_GT(async.last_timing().bytes_copied, 0u);
  EXPECT_EQ(fs::path(last.path).filename().string(), "ckpt-00000013.h5");
  if (comm.rank() == 0) {
    for (int i = 0; i < 4; ++i) {
      const std::string p = dir + "/ckpt-000000" + std::to_string(10 + i) + ".h5";
      EXPECT_TRUE(fs::exists(p)) << p;
      EXPECT_TRUE(verify_checkpoint_file(p).ok) << p;
    }
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_EQ(e.path().string().find(".partial"), std::string::npos) << e.path();
  }
  comm.barrier();
  const ResumeCandidates found = RunDir(dir).resume_candidates(comm);  // the newest first
  ASSERT_FALSE(found.paths.empty());
  EXPECT_EQ(fs::path(found.paths.front()).filename().string(), "ckpt-00000013.h5");
  EXPECT_TRUE(verify_checkpoint_collective(comm, found.paths.front()).empty());
  if (comm.rank() == 0) fs::remove_all(dir);
}

TEST(AsyncCheckpoint, BackgroundFailureThrowsOnAllRanksAtPoll) {
  auto& comm = test::world();
  const std::string dir = test::scratch_dir("async-fail");
  OwnedState src(5, comm.rank());
  AsyncCheckpointer async(comm);
  // A run directory that vanished after training started: the background save must fail.
  async.start(src.state, dir + "/gone", {});
  bool threw = false;
  std::string message;
  for (int i = 0; i < 2000 && !threw; ++i) {
    try {
      if (!async.poll()) {
        async.wait();  // completed everywhere: wait() must report it if poll() did not
        break;
      }
    } catch (const CheckpointError& e) {
      threw = true;
      message = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!threw) {
    try {
      async.wait();
    } catch (const CheckpointError& e) {
      threw = true;
      message = e.what();
    }
  }
  EXPECT_TRUE(threw);
  EXPECT_NE(message.find("gone"), std::string::npos) << message;
  EXPECT_NE(message.find("asynchronous save"), std::string::npos) << message;
  EXPECT_FALSE(async.in_flight());
  // The checkpointer is usable again after a failure.
  async.start(src.state, dir, {});
  EXPECT_NO_THROW(async.wait());
  if (comm.rank() == 0) fs::remove_all(dir);
}

TEST(AsyncCheckpoint, DestructorWaitsForSaveInFlight) {
  auto& comm = test::world();
  const std::string dir = test::scratch_dir("async-dtor");
  OwnedState src(9, comm.rank());
  {
    AsyncCheckpointer async(comm);
    async.start(src.state, dir, {});
  }  // no wait(): the destructor must still let the save commit
  comm.barrier();
  if (comm.rank() == 0) {
    const std::string p = dir + "/ckpt-00000209.h5";
    EXPECT_TRUE(fs::exists(p));
    EXPECT_TRUE(verify_checkpoint_file(p).ok);
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace h5ddp

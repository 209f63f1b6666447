// RunDir: the listing (partials and other files ignored), `latest` and `best` round trips, resume candidates
// and retention, on fake files (empty, named like checkpoints) and, for the keep-best metric, on real ones.
// Run at 1 and 2 ranks: rank 0 writes (Local methods), every rank reads after a barrier.
#include "h5ddp/run_dir.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp_test/checkpoint_fixture.hpp"
#include "h5ddp_test/test_util.hpp"

namespace fs = std::filesystem;
using namespace h5ddp;

namespace {

// Collective: a scratch directory where rank 0 created `files` (empty, or with the given text).
std::string dir_with(const std::string& tag, const std::vector<std::pair<std::string, std::string>>& files) {
  auto& world = test::world();
  const std::string dir = test::scratch_dir(tag);
  if (world.rank() == 0)
    for (const auto& [name, text] : files) std::ofstream(dir + "/" + name, std::ios::trunc) << text;
  world.barrier();
  return dir;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> files_of(const std::vector<CheckpointEntry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.file);
  return out;
}

}  // namespace

TEST(RunDir, ListsCommittedCheckpointsOnlyHighestStepFirst) {
  const std::string dir = dir_with("rundir-list", {{"ckpt-00000010.h5", ""},
                                                   {"ckpt-00000030.h5", ""},
                                                   {"ckpt-00000020.h5", ""},
                                                   {"ckpt-00000040.h5.partial", ""},
                                                   {"ckpt-abc.h5", ""},
                                                   {"final.h5", ""},
                                                   {"latest", "ckpt-00000030.h5\n"},
                                                   {"notes.txt", ""}});
  const RunDir rd(dir);
  EXPECT_EQ(rd.path(), dir);
  EXPECT_EQ(rd.file_path("x.h5"), dir + "/x.h5");
  std::error_code ec;
  const auto c = rd.checkpoints(&ec);
  EXPECT_FALSE(ec);
  EXPECT_EQ(files_of(c), (std::vector<std::string>{"ckpt-00000030.h5", "ckpt-00000020.h5", "ckpt-00000010.h5"}));
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].step, 30);
  EXPECT_FALSE(c[0].value);
  EXPECT_EQ(rd.partials(), std::vector<std::string>{"ckpt-00000040.h5.partial"});
  // A missing directory lists nothing, and that is no error (nothing saved yet).
  const RunDir missing(dir + "/missing");
  EXPECT_TRUE(missing.checkpoints(&ec).empty());
  EXPECT_FALSE(ec);
  EXPECT_TRUE(missing.partials().empty());
  EXPECT_EQ(missing.latest(), "");
  EXPECT_FALSE(missing.best());
  test::world().barrier();
}

TEST(RunDir, LatestRoundTrip) {
  auto& world = test::world();
  const std::string dir = dir_with("rundir-latest", {});
  const RunDir rd(dir);
  EXPECT_EQ(rd.latest(), "");
  world.barrier();
  if (world.rank() == 0) rd.move_latest("ckpt-00000007.h5", false);
  world.barrier();
  EXPECT_EQ(rd.latest(), "ckpt-00000007.h5");
  world.barrier();
  if (world.rank() == 0) {
    rd.move_latest("ckpt-00000009.h5", true);  // with the fsyncs
    std::ifstream in(dir + "/latest");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(all, "ckpt-00000009.h5\n");
  }
  world.barrier();
  EXPECT_EQ(rd.latest(), "ckpt-00000009.h5");
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"latest"});  // no latest.tmp left
  world.barrier();
  // Written by hand (Windows line end, a trailing blank): read as the file name alone.
  if (world.rank() == 0) std::ofstream(dir + "/latest", std::ios::trunc) << "ckpt-00000003.h5 \r\nmore\n";
  world.barrier();
  EXPECT_EQ(rd.latest(), "ckpt-00000003.h5");
  world.barrier();
}

TEST(RunDir, BestRoundTrip) {
  auto& world = test::world();
  const std::string dir = dir_with("rundir-best", {});
  const RunDir rd(dir);
  EXPECT_FALSE(rd.best());
  EXPECT_FALSE(rd.best(world));
  world.barrier();
  if (world.rank() == 0) rd.move_best("ckpt-00000012.h5", 0.8765, false);
  world.barrier();
  {
    std::ifstream in(dir + "/best");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(all, "ckpt-00000012.h5 0.876500\n");  // the format h5ddp-train --keep-best always wrote
  }
  for (const auto& b : {rd.best(), rd.best(world)}) {
    EXPECT_TRUE(b);
    EXPECT_EQ(b.value_or(BestPointer{}).file, "ckpt-00000012.h5");
    EXPECT_DOUBLE_EQ(b.value_or(BestPointer{}).value, 0.8765);
  }
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"best"});
  world.barrier();
  if (world.rank() == 0) std::ofstream(dir + "/best", std::ios::trunc) << "ckpt-00000012.h5\n";  // no value
  world.barrier();
  EXPECT_FALSE(rd.best());
  EXPECT_FALSE(rd.best(world));
  world.barrier();
  if (world.rank() == 0) rd.write_pointer("best", "ckpt-00000004.h5 0.5\n", false);
  world.barrier();
  const std::optional<BestPointer> b = rd.best(world);
  EXPECT_TRUE(b);
  EXPECT_EQ(b.value_or(BestPointer{}).file, "ckpt-00000004.h5");
  EXPECT_DOUBLE_EQ(b.value_or(BestPointer{}).value, 0.5);
  world.barrier();
}

TEST(RunDir, ResumeCandidatesFromTheHighestStepDown) {
  auto& world = test::world();
  const std::string dir = dir_with("rundir-resume", {{"ckpt-00000010.h5", ""},
                                                     {"ckpt-00000020.h5", ""},
                                                     {"ckpt-00000030.h5.partial", ""},
                                                     {"latest", "ckpt-00000010.h5\n"}});
  const RunDir rd(dir);
  const ResumeCandidates a = rd.resume_candidates(world);
  EXPECT_EQ(a.paths, (std::vector<std::string>{dir + "/ckpt-00000020.h5", dir + "/ckpt-00000010.h5"}));
  EXPECT_EQ(a.latest_index, 1);
  EXPECT_TRUE(RunDir(dir + "/missing").resume_candidates(world).paths.empty());
  world.barrier();
}

TEST(RunDir, RetentionRemovesPartialsAndWhatThePolicyGivesUp) {
  auto& world = test::world();
  const std::string dir = dir_with("rundir-retain", {{"ckpt-00000001.h5", ""},
                                                     {"ckpt-00000002.h5", ""},
                                                     {"ckpt-00000003.h5", ""},
                                                     {"ckpt-00000004.h5", ""},
                                                     {"ckpt-00000005.h5", ""},
                                                     {"ckpt-00000006.h5.partial", ""},
                                                     {"latest", "ckpt-00000002.h5\n"},
                                                     {"notes.txt", ""}});
  const RunDir rd(dir);
  if (world.rank() == 0) {
    KeepPolicy keep_all;  // keep_last 0: only the partial goes
    EXPECT_TRUE(rd.apply_retention(keep_all, "ckpt-00000005.h5").empty());
    EXPECT_TRUE(rd.partials().empty());
    EXPECT_EQ(rd.checkpoints().size(), 5u);
    KeepPolicy p;
    p.keep_last = 1;
    p.keep_files = {"ckpt-00000003.h5"};
    // newest (4, pinned although not the highest step), latest (2) and keep_files (3) stay beside the last 1 (5).
    EXPECT_EQ(rd.apply_retention(p, "ckpt-00000004.h5"), std::vector<std::string>{"ckpt-00000001.h5"});
    EXPECT_EQ(files_in(dir), (std::vector<std::string>{"ckpt-00000002.h5", "ckpt-00000003.h5", "ckpt-00000004.h5",
                                                       "ckpt-00000005.h5", "latest", "notes.txt"}));
  }
  world.barrier();
}

// The keep-best rule reads each file's /meta: real checkpoints, saved by all ranks with keep_last 1 and the best
// 1 by eval_accuracy; a file without the value and the newest file do not displace the best.
TEST(RunDir, RetentionKeepsTheBestByAMetaValue) {
  auto& world = test::world();
  const std::string dir = test::scratch_dir("rundir-best-metric");
  SaveOptions opt;
  opt.fsync = false;
  opt.retention.keep_last = 1;
  opt.retention.keep_best = 1;
  opt.retention.best_metric = "eval_accuracy";
  const std::vector<std::pair<int, std::string>> saves = {{2, "0.5"},   {4, "0.9"},  {6, "0.7"}, {8, ""},
                                                          {10, "junk"}, {12, "0.9"}, {14, "0.1"}};
  for (const auto& [step, acc] : saves) {
    test::OwnedState s(7, world.rank());
    s.state.counters.step = step;
    if (!acc.empty()) s.state.meta["eval_accuracy"] = acc;
    save_checkpoint(world, s.state, dir, opt);
  }
  // Step 4 (0.9, the first to reach it) and the newest (14) are left.
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"ckpt-00000004.h5", "ckpt-00000014.h5", "latest"}));
  EXPECT_EQ(opt.retention.best_order, MetricOrder::kHigherIsBetter);  // the default
  world.barrier();
}

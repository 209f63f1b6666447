// The trainer's pure components, without a training run: the progress line, the resume hint, the lr schedules
// and their continuation on resume, the stall watch's limits, the run log and console text, the run start's
// batch check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "h5ddp/error.hpp"
#include "train/lr_schedule.hpp"
#include "train/progress.hpp"
#include "train/resume_hint.hpp"
#include "train/run_log.hpp"
#include "train/run_start.hpp"
#include "train/stall_watch.hpp"

namespace h5ddp {
namespace {

// What a Progress printed, through a memory stream.
struct Captured {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  ~Captured() {
    if (f) std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, size);
  }
};

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(format_duration(0), "00:00");
  EXPECT_EQ(format_duration(59.4), "00:59");
  EXPECT_EQ(format_duration(61), "01:01");
  EXPECT_EQ(format_duration(3600), "1:00:00");
  EXPECT_EQ(format_duration(3 * 3600 + 62), "3:01:02");
  EXPECT_EQ(format_duration(-1), "--:--");
  EXPECT_EQ(format_duration(NAN), "--:--");
}

TEST(Progress, LinesEveryNStepsAndTheLastWithTheIntervalsMeanLoss) {
  Captured out;
  Progress p(true, ProgressMode::kLines, 10, 4, out.f);
  p.start(0);
  for (int s = 1; s <= 10; ++s) p.update(s, 0, 1, s <= 4 ? 1.0 : 3.0, 8, s == 10);
  const std::string text = out.text();
  EXPECT_EQ(count(text, "\n"), 3) << text;  // steps 4, 8 and the last, 10
  EXPECT_NE(text.find("step 4/10  epoch 1/1  loss 1.0000"), std::string::npos) << text;
  EXPECT_NE(text.find("step 8/10  epoch 1/1  loss 3.0000"), std::string::npos) << text;
  EXPECT_NE(text.find("step 10/10"), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
}

TEST(Progress, TtyRewritesOneLineAndDisabledPrintsNothing) {
  Captured tty;
  Progress p(true, ProgressMode::kTty, 3, 0, tty.f);
  p.start(0);
  for (int s = 1; s <= 3; ++s) p.update(s, 0, 2, 0.5, 8, s == 3);
  EXPECT_EQ(tty.text().front(), '\r');
  EXPECT_EQ(count(tty.text(), "\n"), 1) << tty.text();  // only after the last step
  Captured off;
  Progress q(false, ProgressMode::kLines, 3, 1, off.f);
  q.start(0);
  q.update(1, 0, 1, 0.5, 8, true);
  q.end_line();
  EXPECT_EQ(off.text(), "");
}

TEST(ResumeHint, QuotesForTheShell) {
  EXPECT_EQ(shell_join({"a", "b c", "", "it's"}), "a 'b c' '' 'it'\\''s'");
}

TEST(ResumeHint, DropsOptionsThatWouldStartOverOrGoBack) {
  const std::vector<std::string> args{"--epochs", "2", "--resume", "none", "--init-from=x.h5", "--seed", "3"};
  EXPECT_EQ(without_options(args, {"--resume", "--init-from"}),
            (std::vector<std::string>{"--epochs", "2", "--seed", "3"}));
}

TEST(ResumeHint, MpirunLineWithWhatThisMachineNeeds) {
  ResumeHintFacts f;
  f.argv = {"build/tools/h5ddp-train", "--resume", "runs/a/ckpt-00000010.h5", "--max-steps", "20"};
  f.world_size = 4;
  EXPECT_EQ(resume_command(f), "mpirun -np 4 build/tools/h5ddp-train --max-steps 20");
  f.root_user = true;
  f.oversubscribed = true;
  EXPECT_EQ(resume_command(f),
            "mpirun -np 4 --allow-run-as-root --oversubscribe build/tools/h5ddp-train --max-steps 20");
  f.launcher_hint = "H5DDP_NP=4 jobs/train-local.sh --max-steps 20";
  EXPECT_EQ(resume_command(f), f.launcher_hint);
}

LrSchedule schedule(const std::string& type, int64_t horizon) {
  LrSchedule s;
  s.type = type;
  s.base_lr = 0.01;
  s.step_size = 4;
  s.gamma = 0.5;
  s.total_steps = horizon;
  return s;
}

TEST(LrSchedule, ConstantStepCosineAndWarmup) {
  EXPECT_DOUBLE_EQ(schedule("constant", 10).lr_at(7), 0.01);
  const LrSchedule step = schedule("step", 10);
  EXPECT_DOUBLE_EQ(step.lr_at(3), 0.01);
  EXPECT_DOUBLE_EQ(step.lr_at(4), 0.005);
  EXPECT_DOUBLE_EQ(step.lr_at(9), 0.0025);
  const LrSchedule cosine = schedule("cosine", 10);
  EXPECT_DOUBLE_EQ(cosine.lr_at(0), 0.01);
  EXPECT_NEAR(cosine.lr_at(5), 0.005, 1e-12);
  EXPECT_NEAR(cosine.lr_at(10), 0, 1e-12);
  EXPECT_NEAR(cosine.lr_at(15), 0, 1e-12);  // past the horizon: the end value
  LrSchedule warm = schedule("constant", 10);
  warm.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(warm.lr_at(0), 0.0025);
  EXPECT_DOUBLE_EQ(warm.lr_at(3), 0.01);
}

TEST(LrSchedule, StateRoundTripsAndUnknownTypesAreRefused) {
  for (const char* type : {"constant", "step", "cosine"}) {
    LrSchedule s = schedule(type, 12);
    s.warmup_steps = 2;
    const LrSchedule back = LrSchedule::from_state(s.to_state(5));
    EXPECT_TRUE(back.same_shape(s)) << type;
    for (int64_t k = 0; k < 14; ++k) EXPECT_DOUBLE_EQ(back.lr_at(k), s.lr_at(k)) << type << " step " << k;
  }
  SchedulerState bad = schedule("step", 12).to_state(5);
  bad.type = "linear";
  EXPECT_THROW(LrSchedule::from_state(bad), CheckpointError);
}

TEST(LrSchedule, ResumeKeepsTheSavedCosineHorizonAndRefusesAnotherShape) {
  const SchedulerState saved = schedule("cosine", 12).to_state(6);
  std::string note;
  const LrSchedule kept = continued_schedule(saved, schedule("cosine", 20), "ckpt-00000006.h5", 6, &note);
  EXPECT_EQ(kept.total_steps, 12);
  EXPECT_NE(note.find("keeps the checkpoint's horizon of 12 steps (this run plans 20"), std::string::npos) << note;
  note.clear();
  const LrSchedule step = continued_schedule(schedule("step", 12).to_state(6), schedule("step", 30), "f", 6, &note);
  EXPECT_EQ(step.total_steps, 30);  // the horizon does not shape a step schedule: the run's own
  EXPECT_TRUE(note.empty()) << note;
  try {
    continued_schedule(saved, schedule("constant", 20), "ckpt-00000006.h5", 6, &note);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ckpt-00000006.h5 continues the lr schedule cosine"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--replan-lr-schedule"), std::string::npos) << msg;
  }
  SchedulerState none;
  EXPECT_EQ(continued_schedule(none, schedule("step", 9), "f", 0, &note).type, "step");  // a file without one
}

TEST(StallWatch, LimitsConfiguredAutoAndOff) {
  StallWatch fixed(2);
  EXPECT_DOUBLE_EQ(fixed.limit(StallWatch::Kind::kStep), 2);
  EXPECT_DOUBLE_EQ(fixed.limit(StallWatch::Kind::kSave), 20);
  StallWatch off(0);
  EXPECT_DOUBLE_EQ(off.limit(StallWatch::Kind::kStep), 0);
  StallWatch automatic(-1);
  EXPECT_DOUBLE_EQ(automatic.limit(StallWatch::Kind::kStep), kAutoWatchdogStepFloor);
  EXPECT_DOUBLE_EQ(automatic.limit(StallWatch::Kind::kSave), kAutoWatchdogSaveFloor);
  automatic.observe(StallWatch::Kind::kStep, 30);   // 20x the slowest step once above the floor
  automatic.observe(StallWatch::Kind::kSave, 100);  // 10x the slowest save
  EXPECT_DOUBLE_EQ(automatic.limit(StallWatch::Kind::kStep), 600);
  EXPECT_DOUBLE_EQ(automatic.limit(StallWatch::Kind::kSave), 1000);
}

TEST(LrSchedule, ScheduleForOptionsStepSizeDefaultsToAnEpoch) {
  const LrSchedule s = schedule_for("step", 0.1, 0, 0.5, 2, 30, 100);
  EXPECT_EQ(s.type, "step");
  EXPECT_EQ(s.step_size, 30);
  EXPECT_EQ(s.total_steps, 100);
  EXPECT_EQ(s.warmup_steps, 2);
  EXPECT_EQ(schedule_for("step", 0.1, 7, 0.5, 0, 30, 100).step_size, 7);
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct TempDir {
  std::string path = [] {
    char t[] = "/tmp/h5ddp-runlog-XXXXXX";
    return std::string(mkdtemp(t));
  }();
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(RunLog, TrainRecordsEveryIntervalWithTheIntervalsMeanLossAndEachSaveOnce) {
  TempDir dir;
  RunLog log(dir.path, true);
  log.set_interval(2);
  log.start(0, 2);
  log.train(1, 0, 1.0, 0.1, 64, false);
  log.train(2, 0, 3.0, 0.1, 64, false);  // record: mean of 1 and 3
  log.train(3, 0, 5.0, 0.1, 64, true);   // the last step records whatever the interval
  SaveRecord save{3, "run/ckpt-00000003.h5", true, 0.01, 0, 1000};
  log.save(save);
  log.save(save);  // the same save again (stop after a final save): not twice
  log.stop(3, 75, "run/ckpt-00000003.h5");
  const auto lines = lines_of(dir.path + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_NE(lines[0].find("\"event\":\"start\""), std::string::npos);
  EXPECT_NE(lines[1].find("\"step\":2"), std::string::npos);
  EXPECT_NE(lines[1].find("\"loss\":2,"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("\"step\":3"), std::string::npos);
  EXPECT_NE(lines[2].find("\"loss\":5,"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("\"seconds\":null"), std::string::npos) << lines[3];  // async: known when it commits
  EXPECT_NE(lines[4].find("\"signal\":\"SIGUSR1/SIGTERM\""), std::string::npos) << lines[4];
  EXPECT_EQ(metrics_step_of(lines[4]), 3);
  RunLog other_rank(dir.path, false);  // disabled: writes nothing
  other_rank.start(0, 2);
  EXPECT_EQ(lines_of(dir.path + "/metrics.jsonl").size(), 5u);
}

TEST(RunLog, EndRecordCarriesTheTestResultOnlyWhenEvaluated) {
  TempDir dir;
  RunLog log(dir.path, true);
  const EvalResult regression{-1, 0.25};
  log.end(10, 1, 2.5, &regression);
  log.end(10, 1, 2.5, nullptr);
  const auto lines = lines_of(dir.path + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].find("test_accuracy"), std::string::npos);
  EXPECT_NE(lines[0].find("\"test_loss\":0.25"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].find("test_loss"), std::string::npos);
}

TEST(Console, EvalStopAndResumeLines) {
  EXPECT_EQ(console::eval_line(40, EvalResult{0.8712, 0.36}, 10000),
            "eval at step 40: test accuracy 87.12%, loss 0.3600 on 10000 samples");
  EXPECT_EQ(console::eval_line(40, EvalResult{-1, 0.5}, 100),
            "eval at step 40: test loss (mean squared error) 0.5 on 100 samples");
  EXPECT_EQ(console::stopped_line(7, "r/ckpt-00000007.h5", 75),
            "stopped by a signal at step 7; saved r/ckpt-00000007.h5; exit code 75 (requeue me)");
  EXPECT_NE(console::stopped_line(7, "x", 130).find("(interrupted)"), std::string::npos);
  EXPECT_EQ(console::resumed_line("r/c.h5", 12, 0, 768, 2, 4, false),
            "resumed from r/c.h5 at step 12, epoch 1, sample 768 (saved at 2 ranks, now 4; ranks beyond the saved "
            "world size got derived RNG streams)");
  EXPECT_NE(console::nothing_to_train("f.h5", 50, 1, 50, 3).find("already at --max-steps 50"), std::string::npos);
  EXPECT_NE(console::nothing_to_train("f.h5", 50, 3, 0, 3).find("already at --epochs 3"), std::string::npos);
}

TEST(Console, SummaryNamesTheCheckpointAndTheNextCommands) {
  console::Summary s;
  s.step = 20;
  s.epoch = 3;  // one past the last: shown as the epochs asked for
  s.epochs = 2;
  s.train_seconds = 1.25;
  s.world_size = 2;
  s.evaluated = true;
  s.eval = EvalResult{0.5, 1};
  s.test_samples = 10;
  s.checkpoint = "runs/a b/ckpt-00000020.h5";
  s.resume_command = "mpirun -np 2 build/h5ddp-train";
  s.program = "build/h5ddp-train";
  const std::string text = console::summary(s);
  EXPECT_NE(text.find("trained to step 20 (2 of 2 epochs complete) in 1.2 s at 2 ranks\n"), std::string::npos) << text;
  EXPECT_NE(text.find("test accuracy: 50.00% on 10 images\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\n  mpirun -np 2 build/h5ddp-train\n"), std::string::npos) << text;
  EXPECT_NE(text.find("build/h5ddp-ckpt info 'runs/a b/ckpt-00000020.h5'"), std::string::npos) << text;
  s.checkpoint.clear();  // nothing saved: no next commands
  EXPECT_EQ(console::summary(s).find("resume"), std::string::npos);
}

TEST(RunStart, GlobalBatchMustSplitOverRanksAndMicroBatches) {
  EXPECT_EQ(global_batch_problem(64, 2, 4), "");
  const std::string odd = global_batch_problem(63, 2, 1, "the global batch of f.h5");
  EXPECT_NE(odd.find("(the global batch of f.h5)"), std::string::npos) << odd;
  EXPECT_EQ(global_batch_problem(64, 2, 3),
            "--grad-accum 3 does not divide the 32 samples per rank of the global batch 64 at 2 ranks");
  EXPECT_TRUE(same_file("/tmp", "/tmp/"));
  EXPECT_FALSE(same_file("", ""));
  EXPECT_TRUE(same_file("no/such/file", "no/such/file"));  // unresolvable: the text decides
}

}  // namespace
}  // namespace h5ddp

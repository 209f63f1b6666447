// Issue 60 without a training run: the duration parser and --mtbf / --checkpoint-every-steps auto, Young/Daly's
// interval and its re-estimation, the metrics reader, the "lost" record a resume leaves in place of the records it
// drops, and the goodput account of a hand-written two-segment log (every number checked).
#include "train/goodput.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "h5ddp/error.hpp"
#include "train/auto_interval.hpp"
#include "train/config.hpp"
#include "train/metrics.hpp"

namespace h5ddp {
namespace {

struct TempDir {
  std::string path = [] {
    char t[] = "/tmp/h5ddp-goodput-XXXXXX";
    return std::string(mkdtemp(t));
  }();
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string error_of(const std::string& text) {
  try {
    parse_duration(text, "mtbf");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Duration, SecondsOrANumberWithAUnit) {
  EXPECT_EQ(parse_duration("3600", "mtbf"), 3600);
  EXPECT_EQ(parse_duration("30s", "mtbf"), 30);
  EXPECT_EQ(parse_duration("90m", "mtbf"), 5400);
  EXPECT_EQ(parse_duration("1.5h", "mtbf"), 5400);
  EXPECT_EQ(parse_duration("2d", "mtbf"), 172800);
  EXPECT_EQ(parse_duration("0.25", "mtbf"), 0.25);
}

TEST(Duration, ZeroNegativeAndUnparseableAreOneErrorNamingTheOption) {
  for (const char* bad : {"0", "-5", "abc", "", "5x", "5 m", " 5", "inf", "nan", "0h", "-1d", "h"}) {
    const std::string e = error_of(bad);
    EXPECT_NE(e.find("--mtbf " + std::string(bad) + ": must be a duration > 0"), std::string::npos)
        << "'" << bad << "': " << e;
  }
}

ParsedArgs parse(std::vector<const char*> argv) {
  argv.insert(argv.begin(), "h5ddp-train");
  return parse_train_args(static_cast<int>(argv.size()), argv.data());
}

TEST(Options, CheckpointEveryStepsAutoNeedsMtbfAndMtbfNeedsAuto) {
  const ParsedArgs ok = parse({"--checkpoint-every-steps", "auto", "--mtbf", "2h"});
  ASSERT_TRUE(ok.config) << ok.message;
  EXPECT_TRUE(ok.config->checkpoint_auto);
  EXPECT_EQ(ok.config->mtbf_seconds, 7200);
  const ParsedArgs fixed = parse({"--checkpoint-every-steps", "25"});
  ASSERT_TRUE(fixed.config) << fixed.message;
  EXPECT_FALSE(fixed.config->checkpoint_auto);
  EXPECT_EQ(fixed.config->checkpoint_every_steps, 25);
  struct Case {
    std::vector<const char*> argv;
    std::string message;
  };
  const std::vector<Case> bad = {
      {{"--checkpoint-every-steps", "auto"}, "--checkpoint-every-steps auto: needs --mtbf DURATION"},
      {{"--checkpoint-every-steps", "auto", "--mtbf", "0"}, "--mtbf 0: must be a duration > 0"},
      {{"--checkpoint-every-steps", "auto", "--mtbf", "-5"}, "--mtbf -5: must be a duration > 0"},
      {{"--checkpoint-every-steps", "auto", "--mtbf", "abc"}, "--mtbf abc: must be a duration > 0"},
      {{"--mtbf", "6h"}, "--mtbf 6h: is only used by --checkpoint-every-steps auto"},
      {{"--checkpoint-every-steps", "often"}, "--checkpoint-every-steps often: must be a number of steps >= 0"},
      {{"--checkpoint-every-steps", "-3"}, "--checkpoint-every-steps -3: must be a number of steps >= 0"},
  };
  for (const auto& c : bad) {
    const ParsedArgs r = parse(c.argv);
    EXPECT_FALSE(r.config);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.message.find(c.message), std::string::npos) << r.message;
  }
}

TEST(YoungDaly, RoundOfSqrtTwoCostMtbfOverStepTime) {
  EXPECT_EQ(young_daly_steps(2, 3600, 0.1), 1200);     // sqrt(2 x 2 x 3600) = 120 s
  EXPECT_EQ(young_daly_steps(1, 2, 0.5), 4);           // sqrt(4) = 2 s
  EXPECT_EQ(young_daly_steps(0.5, 3600, 7), 9);        // 60 / 7 = 8.57
  EXPECT_EQ(young_daly_steps(0, 3600, 0.1), 1);        // a free save: every step
  EXPECT_EQ(young_daly_steps(1e-9, 1, 10), 1);         // never below 1
  EXPECT_EQ(young_daly_steps(2, 3600, 0), 120000000);  // a step of no measurable time: 1 us
}

TEST(YoungDaly, FirstIntervalThenReEstimatedFromEverySave) {
  AutoInterval a(3600);
  EXPECT_EQ(a.steps(), AutoInterval::kFirstSteps);
  EXPECT_FALSE(a.measured());
  for (int i = 0; i < 10; ++i) a.observe_step(i < 5 ? 0.05 : 0.15);
  EXPECT_DOUBLE_EQ(a.mean_step_seconds(), 0.1);
  EXPECT_EQ(a.update(2, a.mean_step_seconds()), 1200);
  EXPECT_EQ(a.mean_step_seconds(), 0.1);  // no step since: the estimate
  // The save cost drifts to 4 s: smoothed half and half (3 s), the steps to 0.2 s.
  EXPECT_EQ(a.update(4, 0.2), young_daly_steps(3, 3600, 0.2));
  EXPECT_DOUBLE_EQ(a.save_seconds(), 3);
  EXPECT_EQ(AutoInterval(60, 37).steps(), 37);  // a resume's first: the checkpoint's interval
}

TEST(MetricsRecord, ReadsWhatJsonRecordWrites) {
  const std::string line = JsonRecord("save")
                               .add("step", 12)
                               .add("path", "a \"b\"\\c\n")
                               .add("async", true)
                               .add("blocked_seconds", 0.25)
                               .add_null("seconds")
                               .line();
  const auto r = MetricsRecord::parse(line);
  ASSERT_TRUE(r) << line;
  EXPECT_EQ(r->event(), "save");
  EXPECT_EQ(r->number("step"), 12);
  EXPECT_EQ(r->text("path"), "a \"b\"\\c\n");
  EXPECT_EQ(r->number("blocked_seconds"), 0.25);
  EXPECT_TRUE(r->has("seconds"));
  EXPECT_FALSE(r->number("seconds"));  // null
  EXPECT_FALSE(r->number("async"));    // a boolean is no number
  EXPECT_EQ(r->number_or("missing", -1), -1);
  EXPECT_EQ(MetricsRecord::parse("{\"s\":\"\\u00e9\"}")->text("s"), "\xc3\xa9");
  for (const char* bad : {"", "{", "{\"a\":1", "{\"a\":1}x", "[1]", "{\"a\":nope}", "{\"a\" 1}", "{\"a\":{\"b\":1}}"})
    EXPECT_FALSE(MetricsRecord::parse(bad)) << bad;
}

// The records of a killed segment resumed from step 6: start-up 3 s, train 1..9 (1 s each), saves at 3, 6 and 9
// (0.5 s each), an evaluation at 8 (0.25 s); the last record at 113.75.
void write_killed_segment(const std::string& path) {
  std::ofstream out(path);
  out << R"({"event":"start","step":0,"world_size":2,"process_start":100,"time":103})" << '\n';
  double t = 103;
  for (int s = 1; s <= 9; ++s) {
    t += 1;
    out << R"({"event":"train","step":)" << s << R"(,"seconds":1,"steps":1,"time":)" << t << "}\n";
    if (s == 8) out << R"({"event":"eval","step":8,"seconds":0.25,"time":)" << (t += 0.25) << "}\n";
    if (s % 3 == 0)
      out << R"({"event":"save","step":)" << s << R"(,"blocked_seconds":0.5,"seconds":0.5,"time":)" << (t += 0.5)
          << "}\n";
  }
}

TEST(MetricsLog, AResumeLeavesOneLostRecordInPlaceOfTheRecordsItDrops) {
  TempDir dir;
  const std::string path = dir.path + "/metrics.jsonl";
  write_killed_segment(path);
  MetricsLog log(dir.path, true);
  log.truncate_after(6);
  auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 1u + 6 + 2 + 1);  // start, train 1..6, saves 3 and 6, lost
  const auto lost = MetricsRecord::parse(lines.back());
  ASSERT_TRUE(lost) << lines.back();
  EXPECT_EQ(lost->event(), "lost");
  EXPECT_EQ(lost->number("first_step"), 7);
  EXPECT_EQ(lost->number("last_step"), 9);
  EXPECT_EQ(lost->number("train_seconds"), 3);
  EXPECT_EQ(lost->number("blocked_seconds"), 0.5);
  EXPECT_EQ(lost->number("eval_seconds"), 0.25);
  EXPECT_EQ(lost->number("records"), 5);
  EXPECT_EQ(lost->number("time"), 113.75);       // the newest dropped record's: the killed segment's last known time
  EXPECT_EQ(metrics_step_of(lines.back()), -1);  // no "step": a later resume from an earlier step keeps it
  log.truncate_after(3);
  lines = lines_of(path);
  EXPECT_NE(lines[lines.size() - 2].find("\"first_step\":7"), std::string::npos) << lines[lines.size() - 2];
  EXPECT_NE(lines.back().find("\"first_step\":4,\"last_step\":6"), std::string::npos) << lines.back();
  log.truncate_after(3);  // nothing after step 3: no record added
  EXPECT_EQ(lines_of(path).size(), lines.size());
}

TEST(Goodput, TwoSegmentsAddUpToTheirWallTime) {
  TempDir dir;
  const std::string path = dir.path + "/metrics.jsonl";
  write_killed_segment(path);
  MetricsLog(dir.path, true).truncate_after(6);
  {
    std::ofstream out(path, std::ios::app);  // the resume: 4 s of start-up (1.5 s load), steps 7..12, the end
    out << R"({"event":"resume","step":6,"world_size":2,"load_seconds":1.5,"process_start":120,"time":124})" << '\n';
    out << R"({"event":"train","step":12,"seconds":6,"steps":6,"time":130})" << '\n';
    out << R"({"event":"save","step":12,"blocked_seconds":0.5,"time":130.5})" << '\n';
    out << R"({"event":"end","step":12,"eval_seconds":0.75,"wait_seconds":0.125,"time":131.5})" << '\n';
  }
  const GoodputAccount a = goodput_account(read_metrics_log(path));
  ASSERT_EQ(a.segments.size(), 2u);
  const SegmentAccount &s1 = a.segments[0], &s2 = a.segments[1];
  EXPECT_EQ(s1.ended, "killed");
  EXPECT_DOUBLE_EQ(s1.wall, 13.75);  // process start 100 to the lost record's time
  EXPECT_DOUBLE_EQ(s1.startup, 3);
  EXPECT_DOUBLE_EQ(s1.train_kept, 6);
  EXPECT_DOUBLE_EQ(s1.train_lost, 3);
  EXPECT_EQ(s1.lost_steps, 3);
  EXPECT_EQ(s1.lost_first, 7);
  EXPECT_EQ(s1.lost_last, 9);
  EXPECT_DOUBLE_EQ(s1.blocked, 1.5);  // saves at 3 and 6 kept, 9 lost
  EXPECT_DOUBLE_EQ(s1.eval, 0.25);
  EXPECT_NEAR(s1.other, 0, 1e-9);
  EXPECT_EQ(s2.ended, "end");
  EXPECT_TRUE(s2.resumed);
  EXPECT_DOUBLE_EQ(s2.wall, 11.5);
  EXPECT_DOUBLE_EQ(s2.startup, 4);
  EXPECT_DOUBLE_EQ(s2.load, 1.5);
  EXPECT_DOUBLE_EQ(s2.eval, 0.75);
  EXPECT_DOUBLE_EQ(s2.blocked, 0.5 + 0.125);  // the save at 12 and the end's wait for a background save
  EXPECT_DOUBLE_EQ(s2.other, 11.5 - 4 - 6 - 0.5 - 0.125 - 0.75);
  ASSERT_EQ(a.gaps.size(), 1u);
  EXPECT_DOUBLE_EQ(a.gaps[0], 6.25);  // 113.75 to 120: not in the total
  EXPECT_DOUBLE_EQ(a.wall, 25.25);
  EXPECT_DOUBLE_EQ(a.goodput(), 12 / 25.25);
  EXPECT_NEAR(a.startup + a.train_kept + a.train_lost + a.blocked + a.eval + a.other, a.wall, 1e-12);
  const std::string report = goodput_report(a, path);
  EXPECT_NE(report.find("lost: steps 7-9 (3)"), std::string::npos) << report;
  EXPECT_NE(report.find("gap to segment 2: 6.25 s"), std::string::npos) << report;
  EXPECT_NE(report.find("= 12.00 / 25.25 s = 47.5%"), std::string::npos) << report;
  EXPECT_NE(goodput_json(a).find("\"lost_steps\":3"), std::string::npos);
  EXPECT_NE(goodput_line(a).find("the run 47.5% over 2 segments (3 steps redone, 3.0 s)"), std::string::npos)
      << goodput_line(a);
}

TEST(Goodput, NoMetricsLogOrNoRunInItIsSaid) {
  TempDir dir;
  try {
    read_metrics_log(dir.path + "/metrics.jsonl");
    ADD_FAILURE() << "a missing log was read";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no metrics log"), std::string::npos) << e.what();
  }
  std::ofstream(dir.path + "/metrics.jsonl") << "{\"event\":\"train\",\"step\":1}\nnot json\n";
  try {
    read_metrics_log(dir.path + "/metrics.jsonl");
    ADD_FAILURE() << "a log without a run was read";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no start or resume record"), std::string::npos) << e.what();
  }
}

TEST(Goodput, ProcessStartIsBeforeNowAndFromTheKernel) {
  note_main_entry();
  const ProcessStart p = process_start();
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_STREQ(p.source, "proc");  // Linux
  EXPECT_LE(p.seconds, now);
  EXPECT_GT(p.seconds, now - 3600);  // this test process started less than an hour ago
}

}  // namespace
}  // namespace h5ddp

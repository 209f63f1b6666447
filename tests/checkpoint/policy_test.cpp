// The pure policies: when to save (SavePolicy) and what to keep (KeepPolicy). No communication, no files.
#include "h5ddp/policy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace h5ddp;

namespace {

std::string name_of(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%08lld.h5", static_cast<long long>(step));
  return buf;
}

std::vector<CheckpointEntry> entries(const std::vector<int64_t>& steps) {
  std::vector<CheckpointEntry> out;
  for (int64_t s : steps) out.push_back(CheckpointEntry{name_of(s), s, std::nullopt});
  return out;
}

std::vector<std::string> names(const std::vector<int64_t>& steps) {
  std::vector<std::string> out;
  for (int64_t s : steps) out.push_back(name_of(s));
  return out;
}

// Retention as save_checkpoint applied it before KeepPolicy (keep_last, keep_every, keep_files, newest, latest):
// the reference the policy must reproduce for those options.
std::vector<std::string> retention_before_policy(std::vector<CheckpointEntry> ckpts, int keep_last, int keep_every,
                                                 const std::vector<std::string>& keep_files, const std::string& newest,
                                                 const std::string& latest) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  std::sort(ckpts.begin(), ckpts.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  for (size_t i = 0; i < ckpts.size(); ++i) {
    const std::string& n = ckpts[i].file;
    const bool keep = static_cast<int>(i) < keep_last || n == newest || n == latest ||
                      (keep_every > 0 && ckpts[i].step % keep_every == 0) ||
                      std::find(keep_files.begin(), keep_files.end(), n) != keep_files.end();
    if (!keep) removed.push_back(n);
  }
  return removed;
}

}  // namespace

// ---- when to save ---------------------------------------------------------------------------------------

TEST(SavePolicy, EveryZeroOrLessIsOff) {
  for (int64_t every : {0, -1, -100}) {
    const SavePolicy p(every, every);
    for (int64_t step : {0, 1, 2, 100}) EXPECT_FALSE(p.step_due(step)) << every << " " << step;
    for (double s : {0.0, 1.0, 1e9}) EXPECT_FALSE(p.time_due(s)) << every << " " << s;
    EXPECT_FALSE(p.decide(100, 1e9, false).due());
  }
  EXPECT_FALSE(SavePolicy().decide(10, 10, false).due());
}

TEST(SavePolicy, EveryNStepsOnMultiplesOnly) {
  const SavePolicy p(5, 0);
  EXPECT_TRUE(p.step_due(5));
  EXPECT_TRUE(p.step_due(10));
  EXPECT_TRUE(p.step_due(0));  // step % N == 0, as Checkpointer always decided
  for (int64_t step : {1, 4, 6, 9, 11, 12}) EXPECT_FALSE(p.step_due(step)) << step;
  EXPECT_TRUE(SavePolicy(1, 0).step_due(7));
  const SaveDecision d = p.decide(10, 0, false);
  EXPECT_TRUE(d.step && !d.time && !d.signal && d.due());
}

TEST(SavePolicy, EveryTSecondsAtOrPastTheInterval) {
  const SavePolicy p(0, 2.5);
  EXPECT_FALSE(p.time_due(0));
  EXPECT_FALSE(p.time_due(2.4999));
  EXPECT_TRUE(p.time_due(2.5));
  EXPECT_TRUE(p.time_due(100));
  const SaveDecision d = p.decide(3, 3.0, false);
  EXPECT_TRUE(d.time && !d.step && !d.signal);
}

TEST(SavePolicy, StopSignalAlwaysSaves) {
  const SaveDecision d = SavePolicy().decide(3, 0, true);
  EXPECT_TRUE(d.signal && d.due());
  EXPECT_FALSE(d.step || d.time);
  EXPECT_TRUE(SavePolicy(7, 60).decide(3, 1, true).due());
}

TEST(SavePolicy, AgreedInputsDecideAlone) {
  // decide_agreed takes the time trigger as agreed (any rank due): it never looks at a clock, even with every
  // seconds off (the agreement is the caller's, and with the trigger off no rank reports due).
  const SavePolicy p(4, 10);
  EXPECT_FALSE(p.decide_agreed(3, false, false).due());
  EXPECT_TRUE(p.decide_agreed(3, true, false).time);
  EXPECT_TRUE(p.decide_agreed(3, false, true).signal);
  EXPECT_TRUE(p.decide_agreed(8, false, false).step);
  const SaveDecision all = p.decide_agreed(8, true, true);
  EXPECT_TRUE(all.step && all.time && all.signal);
  // decide() is decide_agreed() over this process's own measurement.
  for (int64_t step = 0; step < 20; ++step)
    for (double s : {0.0, 9.9, 10.0, 11.0})
      for (bool sig : {false, true}) {
        const SaveDecision a = p.decide(step, s, sig), b = p.decide_agreed(step, p.time_due(s), sig);
        EXPECT_EQ(a.step, b.step);
        EXPECT_EQ(a.time, b.time);
        EXPECT_EQ(a.signal, b.signal);
      }
}

// ---- what to keep ---------------------------------------------------------------------------------------

TEST(KeepPolicy, KeepLastZeroKeepsEverything) {
  KeepPolicy p;
  p.keep_last = 0;
  p.keep_every = 3;
  p.best_metric = "eval_accuracy";
  p.keep_best = 1;
  EXPECT_TRUE(p.files_to_delete(entries({1, 2, 3, 4, 5, 6, 7})).empty());
  p.keep_last = -2;
  EXPECT_TRUE(p.files_to_delete(entries({1, 2, 3})).empty());
  EXPECT_FALSE(p.needs_values());  // nothing is deleted: no /meta to read
}

TEST(KeepPolicy, LastKNewestByStepWhateverTheInputOrder) {
  KeepPolicy p;
  p.keep_last = 2;
  EXPECT_EQ(p.files_to_delete(entries({30, 10, 50, 20, 40})), names({30, 20, 10}));  // highest step first
  p.keep_last = 5;
  EXPECT_TRUE(p.files_to_delete(entries({30, 10, 50, 20, 40})).empty());
  p.keep_last = 9;
  EXPECT_TRUE(p.files_to_delete(entries({1})).empty());
  EXPECT_TRUE(p.files_to_delete({}).empty());
}

TEST(KeepPolicy, LastIsKeepLastAlone) {  // CheckpointerOptions::retention's default is KeepPolicy::last(3)
  const KeepPolicy p = KeepPolicy::last(3);
  EXPECT_EQ(p.keep_last, 3);
  EXPECT_EQ(p.keep_every, 0);
  EXPECT_TRUE(p.keep_files.empty());
  EXPECT_EQ(p.keep_best, 0);
  EXPECT_FALSE(p.needs_values());
  EXPECT_EQ(p.files_to_delete(entries({10, 50, 20, 40, 30})), names({20, 10}));
}

TEST(KeepPolicy, EveryMKeepsMultiplesOnly) {
  KeepPolicy p;
  p.keep_last = 1;
  p.keep_every = 4;
  // 8 is a multiple, 7, 5 and 2 are not; 9 is the newest.
  EXPECT_EQ(p.files_to_delete(entries({2, 5, 7, 8, 9})), names({7, 5, 2}));
  p.keep_every = 0;
  EXPECT_EQ(p.files_to_delete(entries({2, 5, 7, 8, 9})), names({8, 7, 5, 2}));
  p.keep_every = -4;  // off, like 0
  EXPECT_EQ(p.files_to_delete(entries({2, 5, 7, 8, 9})), names({8, 7, 5, 2}));
}

TEST(KeepPolicy, NamedAndPinnedFilesStay) {
  KeepPolicy p;
  p.keep_last = 1;
  p.keep_files = {name_of(3), "not-there.h5"};
  EXPECT_EQ(p.files_to_delete(entries({1, 2, 3, 4, 5}), {name_of(2)}), names({4, 1}));
}

TEST(KeepPolicy, EqualStepsOrderedByName) {
  KeepPolicy p;
  p.keep_last = 1;
  const std::vector<CheckpointEntry> e = {{"ckpt-5.h5", 5, std::nullopt}, {"ckpt-00000005.h5", 5, std::nullopt}};
  EXPECT_EQ(p.files_to_delete(e), std::vector<std::string>{"ckpt-00000005.h5"});  // "ckpt-5.h5" sorts higher
}

TEST(KeepPolicy, BestByMetricHigherIsBetter) {
  KeepPolicy p;
  p.keep_last = 1;
  p.best_metric = "eval_accuracy";
  p.keep_best = 1;
  EXPECT_TRUE(p.needs_values());
  auto e = entries({2, 4, 6, 8, 10});
  e[0].value = 0.5;
  e[1].value = 0.9;  // step 4: the best
  e[2].value = 0.7;
  e[3].value = std::nullopt;  // missing: never the best
  e[4].value = 0.1;           // the newest, kept by keep_last anyway
  EXPECT_EQ(p.files_to_delete(e), names({8, 6, 2}));
  p.keep_best = 2;
  EXPECT_EQ(p.files_to_delete(e), names({8, 2}));
  p.keep_best = 100;  // more than there are values: every scored file, never the missing one
  EXPECT_EQ(p.files_to_delete(e), names({8}));
  p.best_order = MetricOrder::kLowerIsBetter;
  p.keep_best = 1;  // 0.1 (step 10) is the best and the newest: only keep_last's and best's one file stay
  EXPECT_EQ(p.files_to_delete(e), names({8, 6, 4, 2}));
  p.keep_best = 2;
  EXPECT_EQ(p.files_to_delete(e), names({8, 6, 4}));
}

TEST(KeepPolicy, BestWithMissingOrUnusableValues) {
  KeepPolicy p;
  p.keep_last = 1;
  p.best_metric = "eval_accuracy";
  p.keep_best = 1;
  auto e = entries({1, 2, 3});
  EXPECT_EQ(p.files_to_delete(e), names({2, 1}));  // no values at all: best keeps nothing
  e[0].value = std::numeric_limits<double>::quiet_NaN();
  e[1].value = -std::numeric_limits<double>::infinity();
  EXPECT_EQ(p.files_to_delete(e), names({1}));  // NaN never counts; -inf is a value (the only one)
  // No metric: off whatever keep_best says.
  p.best_metric.clear();
  EXPECT_FALSE(p.needs_values());
  EXPECT_EQ(p.files_to_delete(e), names({2, 1}));
  p.best_metric = "eval_accuracy";
  p.keep_best = 0;
  EXPECT_FALSE(p.needs_values());
  EXPECT_EQ(p.files_to_delete(e), names({2, 1}));
}

TEST(KeepPolicy, BestTiesGoToTheEarlierStep) {
  KeepPolicy p;
  p.keep_last = 1;
  p.best_metric = "eval_accuracy";
  p.keep_best = 1;
  auto e = entries({10, 20, 30, 40});
  e[0].value = 0.5;
  e[1].value = 0.8;
  e[2].value = 0.8;  // equal to step 20's: a later file must beat the best, it does not
  e[3].value = 0.2;
  EXPECT_EQ(p.files_to_delete(e), names({30, 10}));
}

TEST(KeepPolicy, SameAsSaveCheckpointsRetentionForTodaysOptions) {
  std::mt19937 rng(38);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> steps;
    for (int64_t s = 1 + rng() % 3; s < 40; s += 1 + rng() % 4) steps.push_back(s);
    std::shuffle(steps.begin(), steps.end(), rng);
    const auto e = entries(steps);
    KeepPolicy p;
    p.keep_last = static_cast<int>(rng() % 6);
    p.keep_every = static_cast<int>(rng() % 5);
    if (rng() % 2) p.keep_files = {name_of(steps[rng() % steps.size()]), "elsewhere.h5"};
    const std::string newest = name_of(steps[rng() % steps.size()]);
    const std::string latest = rng() % 3 ? name_of(steps[rng() % steps.size()]) : "";
    EXPECT_EQ(p.files_to_delete(e, {newest, latest}),
              retention_before_policy(e, p.keep_last, p.keep_every, p.keep_files, newest, latest))
        << "trial " << trial << " keep_last " << p.keep_last << " keep_every " << p.keep_every;
  }
}

TEST(ParseMetric, WholeStringNumbersOnly) {
  EXPECT_EQ(parse_metric("0.875"), 0.875);
  EXPECT_EQ(parse_metric(" 0.5\n"), 0.5);
  EXPECT_EQ(parse_metric("-1e3"), -1000.0);
  EXPECT_EQ(parse_metric("inf"), std::numeric_limits<double>::infinity());
  EXPECT_FALSE(parse_metric(""));
  EXPECT_FALSE(parse_metric("   "));
  EXPECT_FALSE(parse_metric("abc"));
  EXPECT_FALSE(parse_metric("0.5 0.6"));
  EXPECT_FALSE(parse_metric("0.5x"));
  EXPECT_FALSE(parse_metric("nan"));
}

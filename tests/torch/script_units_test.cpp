// ScriptModule units (plan_units, set_unit_calls): which submodules of a scripted model are units, what forward
// reads outside them, and a forward that calls back around each unit call while computing bitwise what the
// plain forward computes. The models come from script_units_models.py, scripted at test time.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "h5ddp/error.hpp"
#include "h5ddp/script_module.hpp"
#include "h5ddp_test/test_util.hpp"

namespace h5ddp {
namespace {

using Names = std::vector<std::string>;

// The models of script_units_models.py, written once per run into a scratch directory.
const std::string& models_dir() {
  static const std::string dir = [] {
    const std::string d = test::scratch_dir("script-units");
    const char* python = std::getenv("H5DDP_PYTHON");
    const char* source = std::getenv("H5DDP_SOURCE_DIR");
    const std::string cmd = std::string(python ? python : "python3") + " " + (source ? source : ".") +
                            "/tests/torch/script_units_models.py " + d;
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
    return d;
  }();
  return dir;
}

std::string model_path(const std::string& name) {
  return models_dir() + "/" + name + ".pt";
}

std::shared_ptr<ScriptModule> load(const std::string& name) {
  return ScriptModule::load(model_path(name));
}

// Callbacks that log "begin", "enter <unit>", "exit <unit>", "end" (or "end (threw)") into `events`, and hook
// every unit output so that its backward logs "backward <unit>" into `backward`.
struct Recorder {
  Names events, backward;
  UnitCalls calls(const Names& units) {
    UnitCalls c;
    c.begin_forward = [this] { events.push_back("begin"); };
    c.enter = [this, units](size_t u) { events.push_back("enter " + units.at(u)); };
    c.exit = [this, units](size_t u, const at::Tensor& out) {
      events.push_back("exit " + units.at(u));
      if (out.requires_grad())
        out.register_hook([this, name = units.at(u), sizes = out.sizes().vec()](const at::Tensor& grad) {
          EXPECT_EQ(grad.sizes().vec(), sizes);
          backward.push_back("backward " + name);
        });
    };
    c.end_forward = [this](const at::Tensor& out) { events.push_back(out.defined() ? "end" : "end (threw)"); };
    return c;
  }
};

// The events of one forward that calls `units` in this order.
Names expected_events(const Names& units) {
  Names e{"begin"};
  for (const auto& u : units) {
    e.push_back("enter " + u);
    e.push_back("exit " + u);
  }
  e.push_back("end");
  return e;
}

struct Result {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // in named_parameters() order
};

// Forward, then backward of a loss that weighs every output element differently.
Result forward_backward(ScriptModule& m, const torch::Tensor& x) {
  for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
  Result r;
  r.out = m.forward(x);
  const auto w = torch::arange(r.out.numel(), r.out.options()).reshape(r.out.sizes()).div(r.out.numel());
  (r.out * r.out * w).sum().backward();
  for (const auto& p : m.named_parameters())  // undefined for a parameter this forward did not use
    r.grads.push_back(p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor());
  return r;
}

void expect_same(const Result& a, const Result& b) {
  EXPECT_TRUE(torch::equal(a.out, b.out));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << "gradient " << i;
    if (a.grads[i].defined()) {
      EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i])) << "gradient " << i;
    }
  }
}

torch::Tensor gpt_input() {
  torch::manual_seed(1);
  return torch::randint(0, 11, {2, 6}, torch::kLong);
}

TEST(ScriptUnits, GptPlanFindsBlocksInCallOrderAndTiedNamesOutside) {
  auto gpt = load("gpt");
  UnitPlan all = gpt->plan_units({"head", "h.2", "ln_f", "h.0", "tok", "h.1", "pos"});
  EXPECT_EQ(all.units, (Names{"tok", "pos", "h.0", "h.1", "h.2", "ln_f", "head"}));
  EXPECT_TRUE(all.outside.empty());
  EXPECT_TRUE(all.dropped.empty());

  UnitPlan blocks = gpt->plan_units({"h.2", "h.0", "h.1"});
  EXPECT_EQ(blocks.units, (Names{"h.0", "h.1", "h.2"}));
  // The head reads the token embedding's tensor: both of its names are outside.
  EXPECT_EQ(blocks.outside, (Names{"tok.weight", "head.weight", "pos.weight", "ln_f.weight", "ln_f.bias"}));
  EXPECT_TRUE(blocks.dropped.empty());
}

TEST(ScriptUnits, GptForwardCallsBackAroundEachUnitAndComputesTheSame) {
  auto gpt = load("gpt");
  auto reference = load("gpt");
  const Result want = forward_backward(*reference, gpt_input());

  UnitPlan plan = gpt->plan_units({"tok", "pos", "h.0", "h.1", "h.2", "ln_f", "head"});
  Recorder rec;
  gpt->set_unit_calls(plan, rec.calls(plan.units));
  const Result got = forward_backward(*gpt, gpt_input());
  expect_same(got, want);
  EXPECT_EQ(rec.events, expected_events(plan.units));
  // Each exit saw the real output: its hook ran in backward, in reverse order (tok and pos are summed: either first).
  ASSERT_EQ(rec.backward.size(), 7u);
  EXPECT_EQ(Names(rec.backward.begin(), rec.backward.begin() + 5),
            (Names{"backward head", "backward ln_f", "backward h.2", "backward h.1", "backward h.0"}));

  rec.events.clear();
  expect_same(forward_backward(*gpt, gpt_input()), want);
  EXPECT_EQ(rec.events, expected_events(plan.units));
}

TEST(ScriptUnits, SomeOfOneClassAsUnitsLeavesTheClassGraphAlone) {
  // h.0 and h.2 are inlined into the copy, h.1 stays a call of Block.forward, which all three share.
  auto gpt = load("gpt");
  auto reference = load("gpt");
  const Result want = forward_backward(*reference, gpt_input());
  UnitPlan plan = gpt->plan_units({"h.1"});
  EXPECT_EQ(plan.units, Names{"h.1"});
  EXPECT_EQ(plan.outside.size(), 13u);  // tok/head, pos, h.0 and h.2 (4 each), ln_f (2)
  Recorder rec;
  gpt->set_unit_calls(plan, rec.calls(plan.units));
  expect_same(forward_backward(*gpt, gpt_input()), want);
  EXPECT_EQ(rec.events, expected_events({"h.1"}));

  // Back to the plain forward: no callbacks, the same result.
  gpt->set_unit_calls(UnitPlan{}, {});
  rec.events.clear();
  expect_same(forward_backward(*gpt, gpt_input()), want);
  EXPECT_TRUE(rec.events.empty());
}

TEST(ScriptUnits, ExampleGptWithDropoutComputesTheSame) {
  // tools/examples/gpt.py: blocks called with (x, future), a two-name tied head, dropout drawn in the blocks.
  auto model = load("example");
  auto reference = load("example");
  UnitPlan plan = model->plan_units({"wte", "wpe", "h.0", "h.1", "ln_f", "lm_head"});
  EXPECT_EQ(plan.units, (Names{"wte", "wpe", "h.0", "h.1", "ln_f", "lm_head"}));
  EXPECT_TRUE(plan.outside.empty());
  UnitPlan blocks = model->plan_units({"h.0", "h.1"});
  EXPECT_EQ(blocks.outside, (Names{"wte.weight", "lm_head.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}));
  Recorder rec;
  model->set_unit_calls(plan, rec.calls(plan.units));
  torch::manual_seed(5);
  const torch::Tensor x = torch::randint(0, 32, {2, 8}, torch::kLong);
  torch::manual_seed(6);
  const Result want = forward_backward(*reference, x);
  torch::manual_seed(6);
  expect_same(forward_backward(*model, x), want);
  EXPECT_EQ(rec.events, expected_events(plan.units));
}

TEST(ScriptUnits, NestedBlocksAreUnitsAtDepthTwo) {
  auto nested = load("nested");
  auto reference = load("nested");
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({2, 4, 8});
  const Result want = forward_backward(*reference, x);

  UnitPlan plan = nested->plan_units({"transformer.blocks.1", "transformer.blocks.0"});
  EXPECT_EQ(plan.units, (Names{"transformer.blocks.0", "transformer.blocks.1"}));
  EXPECT_EQ(plan.outside, (Names{"emb.weight", "emb.bias", "transformer.ln.weight", "transformer.ln.bias", "out.weight",
                                 "out.bias"}));
  EXPECT_TRUE(plan.dropped.empty());
  Recorder rec;
  nested->set_unit_calls(plan, rec.calls(plan.units));
  expect_same(forward_backward(*nested, x), want);
  EXPECT_EQ(rec.events, expected_events(plan.units));
  EXPECT_EQ(rec.backward, (Names{"backward transformer.blocks.1", "backward transformer.blocks.0"}));

  // The Trunk as the one unit: its blocks run inside its call.
  UnitPlan trunk = nested->plan_units({"transformer"});
  EXPECT_EQ(trunk.units, Names{"transformer"});
  EXPECT_EQ(trunk.outside, (Names{"emb.weight", "emb.bias", "out.weight", "out.bias"}));
}

TEST(ScriptUnits, ResidualModelDropsWhatCannotBeAUnit) {
  auto res = load("residual");
  auto reference = load("residual");
  UnitPlan plan = res->plan_units({"l1", "l2", "pair", "scale", "unused"});
  EXPECT_EQ(plan.units, (Names{"l1", "l2"}));
  EXPECT_EQ(plan.dropped, (Names{"pair: returns Tuple[Tensor, Tensor], not a tensor", "scale: its call takes no tensor",
                                 "unused: never called by forward"}));
  // Dropped modules run inline: their parameters are read outside any unit.
  EXPECT_EQ(plan.outside, (Names{"pair.a.weight", "pair.a.bias", "pair.b.weight", "pair.b.bias", "scale.w"}));

  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({3, 6});
  const Result want = forward_backward(*reference, x);
  Recorder rec;
  res->set_unit_calls(plan, rec.calls(plan.units));
  expect_same(forward_backward(*res, x), want);
  EXPECT_EQ(rec.events, expected_events(plan.units));

  UnitPlan bad;
  bad.units = {"pair"};
  try {
    res->set_unit_calls(bad, {});
    ADD_FAILURE() << "a module returning a tuple became a unit";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'pair' cannot be a unit: returns Tuple[Tensor, Tensor], not a tensor"),
              std::string::npos)
        << e.what();
  }
  // The failed call left the previous units in place.
  rec.events.clear();
  expect_same(forward_backward(*res, x), want);
  EXPECT_EQ(rec.events, expected_events(plan.units));
}

TEST(ScriptUnits, UnitsInsideIfAndLoopAreCalledBackEachTime) {
  auto cond = load("cond");
  auto reference = load("cond");
  UnitPlan plan = cond->plan_units({"b", "a"});
  EXPECT_EQ(plan.units, (Names{"a", "b"}));  // the `if` branch is walked first
  EXPECT_TRUE(plan.outside.empty());
  Recorder rec;
  cond->set_unit_calls(plan, rec.calls(plan.units));
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({2, 5}).abs();
  expect_same(forward_backward(*cond, x), forward_backward(*reference, x));
  EXPECT_EQ(rec.events, expected_events({"a", "b", "b"}));
  rec.events.clear();
  expect_same(forward_backward(*cond, -x), forward_backward(*reference, -x));
  EXPECT_EQ(rec.events, expected_events({"b", "b", "b"}));
}

TEST(ScriptUnits, CandidatesThatNestOrAreNotSubmodulesAreRefused) {
  auto gpt = load("gpt");
  const std::string path = model_path("gpt");
  const auto expect_refusal = [&](const Names& candidates, const std::string& words) {
    try {
      gpt->plan_units(candidates);
      ADD_FAILURE() << "accepted " << words;
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find(words), std::string::npos) << what;
    }
  };
  expect_refusal({"h.0", "h"}, "units 'h' and 'h.0' nest");
  expect_refusal({"h.9"}, "'h.9' is not a submodule");
  expect_refusal({"h.0.fc.weight"}, "'h.0.fc.weight' is not a submodule");
  expect_refusal({"h.1", "h.1"}, "listed twice");
  UnitPlan nest;
  nest.units = {"h", "h.0"};
  EXPECT_THROW(gpt->set_unit_calls(nest, {}), ConfigError);
}

TEST(ScriptUnits, ACallbackErrorReachesTheCallerAsItself) {
  auto gpt = load("gpt");
  UnitPlan plan = gpt->plan_units({"h.0", "h.1", "h.2"});
  Recorder rec;
  UnitCalls calls = rec.calls(plan.units);
  bool fail = true;
  auto enter = calls.enter;
  calls.enter = [&, enter](size_t u) {
    enter(u);
    if (u == 1 && fail) throw ConfigError("gather of h.1 failed");
  };
  gpt->set_unit_calls(plan, calls);
  try {
    gpt->forward(gpt_input());
    ADD_FAILURE() << "the callback's error was lost";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("gather of h.1 failed"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("TorchScript"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rec.events, (Names{"begin", "enter h.0", "exit h.0", "enter h.1", "end (threw)"}));

  // The script's own errors still name the file and the input.
  rec.events.clear();
  try {
    gpt->forward(torch::zeros({2, 9}, torch::kLong));  // longer than the position table
    ADD_FAILURE() << "an input longer than the context passed";
  } catch (const ConfigError&) {
    ADD_FAILURE() << "the script's error came out as the callback's type";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rejects an input of shape [2, 9]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rec.events, (Names{"begin", "end (threw)"}));

  fail = false;
  rec.events.clear();
  gpt->forward(gpt_input());
  EXPECT_EQ(rec.events, expected_events(plan.units));
}

TEST(ScriptUnits, TwoModulesCallTheirOwnCallbacks) {
  auto a = load("cond");
  auto b = load("cond");
  Recorder ra, rb;
  a->set_unit_calls(a->plan_units({"a"}), ra.calls({"a"}));
  b->set_unit_calls(b->plan_units({"b"}), rb.calls({"b"}));
  const torch::Tensor x = torch::ones({1, 5});
  a->forward(x);
  b->forward(x);
  EXPECT_EQ(ra.events, expected_events({"a"}));
  EXPECT_EQ(rb.events, expected_events({"b", "b"}));
}

}  // namespace
}  // namespace h5ddp

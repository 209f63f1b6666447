// Checkpointer (issue 19): resume restores everything or nothing, tracked user state, optimizer type deduced,
// versions filled, triggers and an agreed stop signal. Runs at 1 and 2 ranks.
#include "h5ddp/checkpointer.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/reader.hpp"
#include "h5/h5.hpp"
#include "h5ddp/bucketing.hpp"
#include "h5ddp/ddp.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/stop_signal.hpp"
#include "h5ddp_test/corrupt_dataset.hpp"
#include "h5ddp_test/test_util.hpp"

namespace h5ddp {
namespace {

namespace fs = std::filesystem;

struct Net : torch::nn::Module {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(8, 16))};
  torch::nn::BatchNorm1d bn{register_module("bn", torch::nn::BatchNorm1d(16))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(16, 3))};
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(bn(fc1(x)))); }
};

// A model, an optimizer and a Checkpointer over them, trained a few steps with rank-dependent data (the
// gradients are averaged by hand: this test is about checkpoints, not DDP).
// With o.shard_optimizer the optimizer holds only this rank's parameters (assign_shards, as DDP's ZeRO-1 picks
// them; `holds` overrides the choice) and each step ends by broadcasting every parameter from its owner.
struct Trained {
  explicit Trained(const std::string& dir, const std::string& opt = "adam", CheckpointerOptions o = {},
                   std::function<bool(size_t)> holds = {}) {
    torch::manual_seed(1);
    net = std::make_shared<Net>();
    std::vector<size_t> bytes;
    for (auto& p : net->parameters()) bytes.push_back(p.nbytes());
    owners = assign_shards(bytes, test::world().size());
    std::vector<torch::Tensor> params;
    for (size_t i = 0; i < bytes.size(); ++i)
      if (!o.shard_optimizer || (holds ? holds(i) : owners[i] == test::world().rank()))
        params.push_back(net->parameters()[i]);
    if (opt == "sgd")
      optimizer = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
    else
      optimizer = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
    sharded = o.shard_optimizer;
    o.run_dir = dir;
    o.fsync = false;
    ckpt = std::make_unique<Checkpointer>(test::world(), *net, *optimizer, o);
    ckpt->data().global_batch = 8;
    ckpt->data().seed = 3;
  }

  void train(int steps) {
    auto& w = test::world();
    for (int i = 0; i < steps; ++i) {
      torch::manual_seed(100 + ckpt->step());  // the same data on every rank: replicas stay equal
      auto loss = net->forward(torch::randn({8, 8})).pow(2).mean();
      loss.backward();
      for (auto& p : net->parameters()) {
        auto g = p.grad().contiguous();
        w.allreduce(g.data_ptr<float>(), static_cast<size_t>(g.numel()), DType::kF32, ReduceOp::kSum);
        p.grad().copy_(g / w.size());
      }
      optimizer->step();
      net->zero_grad();  // every parameter's: a sharded optimizer's zero_grad() clears only its own
      if (sharded) {
        torch::NoGradGuard no_grad;
        auto params = net->parameters();
        for (size_t k = 0; k < params.size(); ++k)
          w.broadcast(params[k].data_ptr<float>(), static_cast<size_t>(params[k].numel()), DType::kF32, owners[k]);
      }
      ckpt->data().position += 8;
      ckpt->step_end(ckpt->step() + 1, loss.item<double>());
    }
  }

  std::vector<torch::Tensor> weights() {
    std::vector<torch::Tensor> out;
    for (auto& t : net->parameters()) out.push_back(t.detach().clone());
    for (auto& t : net->buffers()) out.push_back(t.detach().clone());
    return out;
  }

  std::shared_ptr<Net> net;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<Checkpointer> ckpt;
  std::vector<int> owners;
  bool sharded = false;
};

bool equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

std::string attr(const std::string& path, const char* name) {
  h5::Handle f = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  return h5::read_attr_string(f, name);
}

TEST(Checkpointer, DeducesTheOptimizerTypeAndRefusesOthers) {
  torch::nn::Linear lin(2, 2);
  torch::optim::Adam adam(lin->parameters());
  torch::optim::AdamW adamw(lin->parameters());
  torch::optim::SGD sgd(lin->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::RMSprop rms(lin->parameters());
  EXPECT_EQ(optimizer_type_of(adam), "adam");
  EXPECT_EQ(optimizer_type_of(adamw), "adamw");
  EXPECT_EQ(optimizer_type_of(sgd), "sgd");
  EXPECT_THROW(optimizer_type_of(rms), ConfigError);
}

// A weight tied under two names (a language model's head sharing its embedding): LibTorch's parameters() lists it
// twice; unique_parameters() once. An optimizer over the duplicates is refused (it would step the tensor twice);
// one over unique_parameters() saves both names and the state once, and resumes.
TEST(Checkpointer, TiedWeightIsOneParameterUnderTwoNames) {
  struct Holder : torch::nn::Module {
    explicit Holder(const torch::Tensor& w) { register_parameter("weight", w); }
  };
  struct Tied : torch::nn::Module {
    Tied() {
      const torch::Tensor w = torch::randn({5, 3});
      register_module("tok", std::make_shared<Holder>(w));
      register_module("head", std::make_shared<Holder>(w));  // the same tensor: head.weight is tok.weight
    }
  };
  torch::manual_seed(3);  // the same weights on every rank (no DDP here to broadcast them)
  auto net = std::make_shared<Tied>();
  ASSERT_EQ(net->parameters().size(), 2u);
  ASSERT_TRUE(net->parameters()[0].is_same(net->parameters()[1]));
  ASSERT_EQ(unique_parameters(*net).size(), 1u);
  CheckpointerOptions o;
  o.run_dir = test::scratch_dir("ckptr-tied");
  torch::optim::Adam twice(net->parameters());
  EXPECT_THROW(Checkpointer(test::world(), *net, twice, o), ConfigError);
  torch::optim::Adam once(unique_parameters(*net));
  Checkpointer ckpt(test::world(), *net, once, o);
  net->parameters()[0].sum().backward();
  once.step();
  ckpt.data().global_batch = test::world().size();
  ckpt.step_end(1);
  ckpt.save();
  h5::Handle f = h5::file(H5Fopen(ckpt.last_checkpoint().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  EXPECT_GT(H5Lexists(f, "/model/tok.weight", H5P_DEFAULT), 0);
  EXPECT_GT(H5Lexists(f, "/model/head.weight", H5P_DEFAULT), 0);
  EXPECT_GT(H5Lexists(f, "/optimizer/state/tok.weight", H5P_DEFAULT), 0);
  EXPECT_EQ(H5Lexists(f, "/optimizer/state/head.weight", H5P_DEFAULT), 0);
}

TEST(Checkpointer, FreshStartThenResumeRestoresEverythingAndTrackedState) {
  const std::string dir = test::scratch_dir("ckptr-resume");
  torch::Tensor ema = torch::arange(5, torch::kFloat);
  int64_t counter = 0;
  double scale = 0;
  std::vector<torch::Tensor> saved_weights;
  {
    CheckpointerOptions o;
    o.every_steps = 3;
    Trained s(dir, "adam", o);
    s.ckpt->track("ema", ema);
    s.ckpt->track("counter", &counter);
    s.ckpt->track("scale", &scale);
    EXPECT_FALSE(s.ckpt->resume().resumed);
    s.train(2);
    ema.add_(1);
    counter = 41;
    scale = 0.5;
    s.train(1);  // step 3: saved
    EXPECT_EQ(s.ckpt->last_saved_step(), 3);
    saved_weights = s.weights();
    const std::string path = s.ckpt->last_checkpoint();
    EXPECT_EQ(attr(path, "torch_version"), std::to_string(TORCH_VERSION_MAJOR) + "." +
                                               std::to_string(TORCH_VERSION_MINOR) + "." +
                                               std::to_string(TORCH_VERSION_PATCH));
  }
  ema.zero_();
  counter = 0;
  scale = 0;
  Trained r(dir);
  r.ckpt->track("ema", ema);
  r.ckpt->track("counter", &counter);
  r.ckpt->track("scale", &scale);
  const ResumeInfo info = r.ckpt->resume();
  ASSERT_TRUE(info.resumed);
  EXPECT_EQ(info.step, 3);
  EXPECT_EQ(r.ckpt->data().position, 24);
  EXPECT_EQ(r.ckpt->counters().samples_consumed, 24);
  EXPECT_TRUE(info.rng_exact);
  EXPECT_TRUE(equal(r.weights(), saved_weights));
  EXPECT_TRUE(torch::equal(ema, torch::arange(5, torch::kFloat) + 1));
  EXPECT_EQ(counter, 41);
  EXPECT_EQ(scale, 0.5);
  EXPECT_FALSE(r.optimizer->state().empty());
}

// A resume is one descent (issue 38): the checkpoint layer opens the file once, reads its manifest once and asks
// the Checkpointer for the destinations (the optimizer state it allocates), instead of a read_manifest open
// followed by a load_checkpoint open. Counted by the checkpoint layer's test counter, on every rank: since
// issue 59 only rank 0 opens it (with HDF5); the others read tensor bytes at the offsets it shares.
TEST(Checkpointer, ResumeOpensTheFileOncePerJob) {
  const std::string dir = test::scratch_dir("ckptr-one-open");
  std::string path;
  {
    Trained s(dir);
    s.train(2);
    path = s.ckpt->save().path;
  }
  auto opens_during = [](const std::function<void()>& f) {
    const int before = ckpt::checkpoint_opens();
    f();
    return ckpt::checkpoint_opens() - before;
  };
  const int once = test::world().rank() == 0 ? 1 : 0;
  {
    Trained r(dir);
    EXPECT_EQ(opens_during([&] { EXPECT_TRUE(r.ckpt->resume().resumed); }), once);
    EXPECT_FALSE(r.optimizer->state().empty());  // allocated from the manifest of that one open
  }
  {
    Trained r(dir);
    EXPECT_EQ(opens_during([&] { EXPECT_EQ(r.ckpt->resume_from(path).step, 2); }), once);
  }
  Trained r(test::scratch_dir("ckptr-one-open-weights"), "sgd");  // the file's adam state goes to scratch
  EXPECT_EQ(opens_during([&] { r.ckpt->load_weights(path); }), once);
}

TEST(Checkpointer, DamagedCandidateLeavesNothingHalfLoaded) {
  const std::string dir = test::scratch_dir("ckptr-damaged");
  {
    Trained s(dir);
    s.train(2);
    s.ckpt->save();
    s.train(2);
    s.ckpt->save();
  }
  const std::string newest = dir + "/ckpt-00000004.h5", older = dir + "/ckpt-00000002.h5";
  test::corrupt_dataset(newest, "/optimizer/state/fc2.weight/exp_avg_sq");
  {  // the damaged newest is skipped, the older one loads
    Trained r(dir);
    const ResumeInfo info = r.ckpt->resume();
    EXPECT_TRUE(info.resumed);
    EXPECT_EQ(info.path, older);
    EXPECT_EQ(r.ckpt->step(), 2);
  }
  test::corrupt_dataset(older, "/model/fc2.bias");
  Trained r(dir);
  r.train(1);  // some optimizer state and weights of this process
  const auto before = r.weights();
  const size_t opt_entries = r.optimizer->state().size();
  const ResumeInfo info = r.ckpt->resume();  // both damaged: a fresh start with the state as it was
  EXPECT_FALSE(info.resumed);
  EXPECT_TRUE(equal(r.weights(), before));
  EXPECT_EQ(r.optimizer->state().size(), opt_entries);
  EXPECT_THROW(r.ckpt->resume_from(newest), Error);  // an explicit file: an error, and still nothing changed
  EXPECT_TRUE(equal(r.weights(), before));
  EXPECT_EQ(r.optimizer->state().size(), opt_entries);
  r.train(1);  // and training goes on from there
}

TEST(Checkpointer, AnotherOptimizerOrTrackedStateIsAnErrorOnEveryRank) {
  const std::string dir = test::scratch_dir("ckptr-mismatch");
  {
    Trained s(dir);
    s.train(1);
    s.ckpt->save();
  }
  {
    Trained r(dir, "sgd");
    const auto before = r.weights();
    try {
      r.ckpt->resume();
      ADD_FAILURE() << "resumed an adam checkpoint into SGD";
    } catch (const CheckpointMismatchError& e) {  // another model (docs/FORMAT.md "Loading"): no fallback
      EXPECT_NE(std::string(e.what()).find("optimizer state of type adam"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(equal(r.weights(), before));
  }
  Trained r(dir);
  torch::Tensor extra = torch::zeros({2});
  r.ckpt->track("extra", extra);
  try {
    r.ckpt->resume();
    ADD_FAILURE() << "resumed a file without the tracked state";
  } catch (const CheckpointMismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("/user/extra"), std::string::npos) << e.what();
    EXPECT_EQ(e.file(), dir + "/ckpt-00000001.h5") << "the refused file, as a field on every rank";
  }
}

TEST(Checkpointer, LoadWeightsTakesOnlyTheWeightsOfAnyOptimizersFile) {
  const std::string dir = test::scratch_dir("ckptr-weights");
  std::vector<torch::Tensor> saved;
  {
    Trained s(dir, "sgd");
    s.train(2);
    s.ckpt->save();
    saved = s.weights();
  }
  Trained r(test::scratch_dir("ckptr-weights-new"));
  r.ckpt->load_weights(dir + "/ckpt-00000002.h5");
  EXPECT_TRUE(equal(r.weights(), saved));
  EXPECT_TRUE(r.optimizer->state().empty());
  EXPECT_EQ(r.ckpt->step(), 0);
}

TEST(Checkpointer, SignalOnOneRankStopsAndSavesOnAll) {
  const std::string dir = test::scratch_dir("ckptr-signal");
  Trained s(dir);
  s.train(2);
  if (test::world().rank() == test::world().size() - 1) std::raise(SIGUSR1);
  StepOutcome o = s.ckpt->step_end(3);
  EXPECT_TRUE(o.stop);
  EXPECT_TRUE(o.saved);
  EXPECT_EQ(o.exit_code, stop_signal::kExitRequeue);
  EXPECT_EQ(s.ckpt->exit_code(), stop_signal::kExitRequeue);
  EXPECT_TRUE(fs::exists(dir + "/ckpt-00000003.h5"));
  stop_signal::clear();
}

TEST(Checkpointer, AsyncSavesAreCommittedByFinish) {
  const std::string dir = test::scratch_dir("ckptr-async");
  CheckpointerOptions o;
  o.async = true;
  o.every_steps = 2;
  o.retention.keep_last = 2;
  Trained s(dir, "adam", o);
  s.train(5);
  const SaveResult r = s.ckpt->finish();
  EXPECT_EQ(r.path, dir + "/ckpt-00000005.h5");
  EXPECT_EQ(s.ckpt->last_saved_step(), 5);
  EXPECT_FALSE(fs::exists(dir + "/ckpt-00000002.h5"));  // keep_last 2: 4 and 5 remain
  EXPECT_TRUE(fs::exists(dir + "/ckpt-00000004.h5"));
}

// The library keeps what h5ddp-train and h5ddp_torch keep unless told otherwise: the 3 newest files (README's
// own-loop snippet sets no keep_last; it used to keep every file of a run).
TEST(Checkpointer, DefaultRetentionKeepsThreeNewest) {
  const std::string dir = test::scratch_dir("ckptr-default-keep");
  CheckpointerOptions o;
  o.every_steps = 1;
  Trained s(dir, "sgd", o);
  s.train(5);
  s.ckpt->finish();
  for (int step : {1, 2}) EXPECT_FALSE(fs::exists(dir + "/ckpt-0000000" + std::to_string(step) + ".h5")) << step;
  for (int step : {3, 4, 5}) EXPECT_TRUE(fs::exists(dir + "/ckpt-0000000" + std::to_string(step) + ".h5")) << step;
}

// Everything a file holds that training depends on, by checksum: model, optimizer state, parameter groups.
std::string content(const std::string& path) {
  const CheckpointManifest m = read_manifest(test::world(), path);
  std::string out = m.optimizer_type + "\n";
  for (const auto* list : {&m.model, &m.optimizer_state})
    for (const auto& t : *list) out += t.name + " " + std::to_string(t.checksum) + "\n";
  for (const auto& g : m.param_groups) {
    for (const auto& n : g.params) out += "group " + n + "\n";
    for (const auto& [k, v] : g.hyper) out += k + "=" + std::to_string(v) + "\n";
  }
  return out;
}

CheckpointerOptions shard_options() {
  CheckpointerOptions o;
  o.shard_optimizer = true;
  return o;
}

// Issue 25: a sharded optimizer's checkpoint is the replicated run's file, byte for byte in every tensor, and
// either kind resumes from either file into the same continuation.
TEST(Checkpointer, ShardedOptimizerWritesTheReplicatedFileAndResumesEitherWay) {
  const std::string rep = test::scratch_dir("ckptr-shard-rep"), sh = test::scratch_dir("ckptr-shard-sh");
  {
    Trained a(rep);
    a.train(3);
    a.ckpt->save();
  }
  size_t owned = 0;
  {
    Trained b(sh, "adam", shard_options());
    b.train(3);
    b.ckpt->save();
    for (int o : b.owners) owned += o == test::world().rank();
    EXPECT_EQ(b.optimizer->state().size(), owned);
  }
  const std::string f3 = "/ckpt-00000003.h5";
  ASSERT_EQ(content(rep + f3), content(sh + f3));
  EXPECT_TRUE(verify_checkpoint_collective(test::world(), sh + f3).empty());

  std::vector<std::string> continued;
  auto continue_from = [&](const std::string& file, bool sharded, const std::string& tag) {
    const std::string dir = test::scratch_dir(tag);
    Trained c(dir, "adam", sharded ? shard_options() : CheckpointerOptions{});
    ASSERT_TRUE(c.ckpt->resume_from(file).resumed);
    EXPECT_EQ(c.optimizer->state().size(), sharded ? owned : c.net->parameters().size());
    c.train(2);
    c.ckpt->save();
    continued.push_back(content(dir + "/ckpt-00000005.h5"));
  };
  continue_from(rep + f3, false, "ckptr-shard-rr");
  continue_from(rep + f3, true, "ckptr-shard-rs");
  continue_from(sh + f3, false, "ckptr-shard-sr");
  continue_from(sh + f3, true, "ckptr-shard-ss");
  for (size_t i = 1; i < continued.size(); ++i) EXPECT_EQ(continued[i], continued[0]) << "continuation " << i;
}

// Two ranks claiming the same parameter's state: an agreed error before anything is written.
TEST(Checkpointer, OverlappingOptimizerShardsAreAnErrorOnEveryRank) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::string dir = test::scratch_dir("ckptr-shard-overlap");
  const int rank = test::world().rank();
  Trained s(dir, "adam", shard_options(), [&](size_t i) { return rank == 0 || i % 2 == 1; });
  s.train(1);
  try {
    s.ckpt->save();
    ADD_FAILURE() << "saved overlapping shards on rank " << rank;
  } catch (const DisagreementError& e) {
    EXPECT_NE(std::string(e.what()).find("is held by ranks 0 and 1"), std::string::npos) << e.what();
  }
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().rfind("ckpt-", 0), std::string::npos) << entry.path();
}

// Shards that leave part of a file's optimizer state without a rank: a mismatch naming it, nothing loaded.
TEST(Checkpointer, ShardsThatLeaveStateUnloadedAreAMismatch) {
  const std::string dir = test::scratch_dir("ckptr-shard-gap");
  {
    Trained s(dir);
    s.train(1);
    s.ckpt->save();
  }
  Trained r(test::scratch_dir("ckptr-shard-gap-new"), "adam", shard_options(),
            [&](size_t i) { return i == 0 && test::world().rank() == 0; });
  const auto before = r.weights();
  try {
    r.ckpt->resume_from(dir + "/ckpt-00000001.h5");
    ADD_FAILURE() << "loaded a partial optimizer state";
  } catch (const CheckpointMismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("not in the optimizer state of any rank: /optimizer/state/fc2.weight/exp_avg"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(equal(r.weights(), before));
  EXPECT_TRUE(r.optimizer->state().empty());
}

}  // namespace
}  // namespace h5ddp

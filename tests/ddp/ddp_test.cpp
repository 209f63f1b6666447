// The three wrappers over one reducer (DistributedDataParallel, ShardedDataParallel at stages 1-2,
// FullyShardedDataParallel): N ranks with per-rank batch b must train exactly like 1 rank with batch N*b.
// Every rank computes the 1-rank reference locally (a copy of the model, the full batch), so the test needs
// no other process and compares with a tolerance; parameters must also be bitwise identical across ranks.
#include "h5ddp/ddp.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "h5ddp/error.hpp"
#include "h5ddp/fsdp.hpp"
#include "h5ddp/sharded_optimizer.hpp"
#include "h5ddp_test/test_util.hpp"

namespace h5ddp {
namespace {

struct TinyNetImpl : torch::nn::Module {
  explicit TinyNetImpl(int hidden = 16, bool with_bn = false, torch::Dtype dtype = torch::kFloat32) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 4));
    side = register_module("side", torch::nn::Linear(8, 4));  // used only when forward(x, true)
    if (with_bn) bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    to(dtype);
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_side = true) {
    if (fsdp) return fsdp->run_forward([&] { return body(x, use_side); });  // the root gathered around it
    return body(x, use_side);
  }
  torch::Tensor body(const torch::Tensor& x, bool use_side) {
    // Each layer that is a unit through fsdp->run_unit (which gathers its parameters there).
    auto run = [&](const char* unit, const std::function<torch::Tensor()>& f) {
      const bool is_unit = fsdp && std::count(fsdp->unit_names().begin(), fsdp->unit_names().end(), unit);
      return is_unit ? fsdp->run_unit(unit, f) : f();
    };
    auto h = run("fc1", [&] { return fc1->forward(x); });
    if (bn) h = run("bn", [&] { return bn->forward(h); });
    auto y = run("fc2", [&] { return fc2->forward(torch::tanh(h)); });
    return use_side ? y + run("side", [&] { return side->forward(x); }) : y;
  }
  FullyShardedDataParallel* fsdp = nullptr;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, side{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(TinyNet);

uint64_t hash_tensors(const std::vector<torch::Tensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : tensors) {
    auto c = p.detach().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}
uint64_t hash_params(torch::nn::Module& m) {
  return hash_tensors(m.parameters());
}

void copy_params(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard g;
  auto a = from.parameters(), b = to.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

double max_rel_diff(const std::vector<torch::Tensor>& pa, const std::vector<torch::Tensor>& pb) {
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    auto d = (pa[i] - pb[i]).abs().max().item<double>();
    auto s = pb[i].abs().max().item<double>();
    worst = std::max(worst, d / std::max(s, 1e-12));
  }
  return worst;
}

// Batch for step `step`: the full N*b batch, identical on every rank.
std::pair<torch::Tensor, torch::Tensor> full_batch(int step, int64_t rows, torch::Dtype dtype) {
  torch::manual_seed(10'000 + step);
  auto x = torch::randn({rows, 8}).to(dtype);
  auto y = torch::randn({rows, 4}).to(dtype);
  return {x, y};
}

enum class Opt { kSgdMomentum, kAdam };

std::unique_ptr<torch::optim::Optimizer> make_opt(const std::vector<torch::Tensor>& params, Opt o) {
  if (o == Opt::kSgdMomentum)
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
}

enum class Wrap { kReplicated, kStage1, kStage2, kStage3 };

// The wrapper `wrap` names. Stage 3's units: `units` (empty: the top-level children).
std::unique_ptr<DataParallel> make_wrapper(Wrap wrap, torch::nn::Module& model, DdpOptions options,
                                           std::vector<std::string> units = {}) {
  auto& comm = test::world();
  if (wrap == Wrap::kReplicated) return std::make_unique<DistributedDataParallel>(comm, model, options);
  if (wrap != Wrap::kStage3)
    return std::make_unique<ShardedDataParallel>(
        comm, model, wrap == Wrap::kStage1 ? ShardStage::kOptimizer : ShardStage::kGradients, options);
  FsdpOptions f;
  f.ddp = options;
  f.units = std::move(units);
  return std::make_unique<FullyShardedDataParallel>(comm, model, f);
}

// Sharded, a ShardedOptimizer holds this rank's pieces only and its step() gathers the others' (ZeRO-1/2; under
// ZeRO-3 the next forward gathers); the result must still be the large-batch reference's.
void run_equivalence(Opt opt_kind, Wrap wrap, DdpOptions options, torch::Dtype dtype, double tol,
                     std::vector<std::string> units = {}) {
  auto& comm = test::world();
  const int n = comm.size(), r = comm.rank();
  const int64_t b = 3;
  torch::manual_seed(1000 + r);  // ranks start different: the constructor's broadcast must fix that
  TinyNet model(16, false, dtype);
  const size_t n_units = units.empty() ? 3 : units.size();
  std::unique_ptr<DataParallel> wrapper = make_wrapper(wrap, *model, options, std::move(units));
  DataParallel& ddp = *wrapper;
  auto* sharded = dynamic_cast<ShardedDataParallel*>(&ddp);
  model->fsdp = dynamic_cast<FullyShardedDataParallel*>(&ddp);
  TinyNet ref(16, false, dtype);
  {
    torch::NoGradGuard g;  // stage 3 keeps the weights in pieces: the whole ones come from full_parameters()
    auto from = ddp.full_parameters(), to = ref->parameters();
    for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  }
  std::unique_ptr<ShardedOptimizer> sharded_opt;
  std::unique_ptr<torch::optim::Optimizer> plain_opt;
  if (sharded)
    sharded_opt = std::make_unique<ShardedOptimizer>(
        *sharded, [&](std::vector<torch::Tensor> p) { return make_opt(p, opt_kind); });
  else
    plain_opt = make_opt(ddp.owned_parameters(), opt_kind);
  torch::optim::Optimizer& opt = sharded_opt ? sharded_opt->local() : *plain_opt;
  auto ref_opt = make_opt(ref->parameters(), opt_kind);

  for (int step = 0; step < 20; ++step) {
    auto [x, y] = full_batch(step, n * b, dtype);
    ddp.prepare_forward();
    auto loss = torch::mse_loss(model->forward(x.narrow(0, r * b, b)), y.narrow(0, r * b, b));
    loss.backward();
    ddp.finish_backward();
    if (sharded_opt) {
      sharded_opt->step();  // gathers
      sharded_opt->zero_grad();
    } else {
      opt.step();
      opt.zero_grad();
    }

    torch::mse_loss(ref->forward(x), y).backward();
    ref_opt->step();
    ref_opt->zero_grad();

    ASSERT_TRUE(comm.agree(hash_tensors(ddp.full_parameters())))
        << "parameters differ across ranks after step " << step;
  }
  const double diff = max_rel_diff(ddp.full_parameters(), ref->parameters());
  EXPECT_LT(diff, tol) << "after 20 steps, N=" << n;
  EXPECT_EQ(ddp.stats().steps, 20u);
  if (model->fsdp) {  // the weights live in the pieces only, between uses
    for (const auto& p : model->parameters()) EXPECT_EQ(p.storage().nbytes(), 0u);
    // Per step: the root once (it stays for the backward), each unit in forward and again in backward, and
    // full_parameters() per step, before the steps and after: every unit and the root once each.
    const size_t per_full = n_units + 1;
    EXPECT_EQ(ddp.stats().unit_gathers, per_full + 20u * (1 + 2 * n_units + per_full) + per_full);
  }
  EXPECT_EQ(ddp.stats().buckets_launched, 20u * ddp.buckets().size());
  if (sharded) {
    // State for this rank's pieces only, and every element's state on exactly one rank.
    EXPECT_EQ(opt.state().size(), ddp.owned_parameters().size());
    int64_t held = 0, total = 0;
    for (const auto& [key, st] : opt.state()) {
      (void)key;
      held += opt_kind == Opt::kAdam ? static_cast<torch::optim::AdamParamState&>(*st).exp_avg().numel()
                                     : static_cast<torch::optim::SGDParamState&>(*st).momentum_buffer().numel();
    }
    comm.allreduce(&held, 1, DType::kI64, ReduceOp::kSum);
    for (const auto& p : model->parameters()) total += p.numel();
    EXPECT_EQ(held, total);
    for (const auto& p : model->parameters())  // stage 1: zeroed by the gather; stage 2: not kept at all
      if (wrap == Wrap::kStage2 || wrap == Wrap::kStage3)
        EXPECT_FALSE(p.grad().defined());
      else
        EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  }
}

DdpOptions small_buckets() {
  DdpOptions o;
  o.first_bucket_bytes = 64;  // several buckets even for this tiny model
  o.bucket_cap_bytes = 300;
  return o;
}

TEST(Ddp, SgdMomentumMatchesLargeBatch) {
  run_equivalence(Opt::kSgdMomentum, Wrap::kReplicated, small_buckets(), torch::kFloat32, 1e-5);
}
TEST(Ddp, AdamMatchesLargeBatch) {
  run_equivalence(Opt::kAdam, Wrap::kReplicated, small_buckets(), torch::kFloat32, 1e-5);
}
TEST(Ddp, SgdMomentumMatchesLargeBatchFloat64) {
  run_equivalence(Opt::kSgdMomentum, Wrap::kReplicated, DdpOptions{}, torch::kFloat64, 1e-6);
}
TEST(Ddp, AdamMatchesLargeBatchFloat64) {
  run_equivalence(Opt::kAdam, Wrap::kReplicated, small_buckets(), torch::kFloat64, 1e-6);
}

TEST(Ddp, ShardedAdamMatchesLargeBatch) {
  run_equivalence(Opt::kAdam, Wrap::kStage1, small_buckets(), torch::kFloat32, 1e-5);
}
TEST(Ddp, ShardedSgdMomentumMatchesLargeBatchFloat64) {
  run_equivalence(Opt::kSgdMomentum, Wrap::kStage1, DdpOptions{}, torch::kFloat64, 1e-6);
}
TEST(Ddp, Stage2AdamMatchesLargeBatch) {
  run_equivalence(Opt::kAdam, Wrap::kStage2, small_buckets(), torch::kFloat32, 1e-5);
}
TEST(Ddp, Stage2SgdMomentumMatchesLargeBatchFloat64) {
  run_equivalence(Opt::kSgdMomentum, Wrap::kStage2, DdpOptions{}, torch::kFloat64, 1e-6);
}
TEST(Ddp, Stage3AdamMatchesLargeBatch) {
  run_equivalence(Opt::kAdam, Wrap::kStage3, DdpOptions{}, torch::kFloat32, 1e-5);
}
TEST(Ddp, Stage3SgdMomentumMatchesLargeBatchFloat64) {
  run_equivalence(Opt::kSgdMomentum, Wrap::kStage3, DdpOptions{}, torch::kFloat64, 1e-6);
}
// A layer in no unit joins the root, gathered for the whole forward and backward.
// Stage 3 with prefetch on and off: `reorder` runs `side` first in every third step (the same arithmetic, so a
// forward that leaves the recorded order: prefetch must stop predicting and free the unit it started ahead).
struct Stage3Run {
  std::vector<torch::Tensor> params;
  DataParallel::Stats stats;
  bool freed_between_steps = true;  // no parameter storage left after any finish_backward
};
Stage3Run train_stage3(bool prefetch, bool reorder) {
  auto& comm = test::world();
  const int n = comm.size(), r = comm.rank();
  const int64_t b = 3;
  torch::manual_seed(77);
  TinyNet model(16);
  FsdpOptions o;
  o.prefetch = prefetch;
  FullyShardedDataParallel fsdp(comm, *model, o);
  ShardedOptimizer opt(fsdp, [](std::vector<torch::Tensor> p) { return make_opt(p, Opt::kAdam); });
  Stage3Run run;
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = full_batch(step, n * b, torch::kFloat32);
    const torch::Tensor xr = x.narrow(0, r * b, b);
    const bool side_first = reorder && step % 3 == 2;
    fsdp.prepare_forward();
    auto out = fsdp.run_forward([&] {
      torch::Tensor s;
      if (side_first) s = fsdp.run_unit("side", [&] { return model->side->forward(xr); });
      auto h = fsdp.run_unit("fc1", [&] { return model->fc1->forward(xr); });
      auto z = fsdp.run_unit("fc2", [&] { return model->fc2->forward(torch::tanh(h)); });
      if (!side_first) s = fsdp.run_unit("side", [&] { return model->side->forward(xr); });
      return z + s;
    });
    torch::mse_loss(out, y.narrow(0, r * b, b)).backward();
    fsdp.finish_backward();
    for (const auto& p : model->parameters()) run.freed_between_steps &= p.storage().nbytes() == 0;
    opt.step();
    opt.zero_grad();
  }
  run.stats = fsdp.stats();
  run.params = fsdp.full_parameters();
  return run;
}

TEST(Ddp, Stage3PrefetchTrainsBitwiseLikeBlockingGathers) {
  auto& comm = test::world();
  for (bool reorder : {false, true}) {
    SCOPED_TRACE(reorder ? "order changes every third step" : "one order");
    const Stage3Run on = train_stage3(true, reorder), off = train_stage3(false, reorder);
    ASSERT_EQ(on.params.size(), off.params.size());
    for (size_t i = 0; i < on.params.size(); ++i) EXPECT_TRUE(torch::equal(on.params[i], off.params[i])) << i;
    EXPECT_TRUE(comm.agree(hash_tensors(on.params)));
    EXPECT_TRUE(on.freed_between_steps);
    EXPECT_TRUE(off.freed_between_steps);
    EXPECT_EQ(off.stats.prefetched, 0u);
    EXPECT_GT(on.stats.prefetched, 0u);
    if (!reorder) {
      // The first forward records the order: its backward prefetches (side at end_forward, then fc2 and fc1), and
      // every later step also fc2 and side in its forward. Every prediction used: the same gathers as without.
      EXPECT_EQ(on.stats.prefetched, 3u + 19u * 5u);
      EXPECT_EQ(on.stats.unit_gathers, off.stats.unit_gathers);
    }
  }
}

TEST(Ddp, Stage3RootHoldsTheParametersOutsideEveryUnit) {
  run_equivalence(Opt::kAdam, Wrap::kStage3, DdpOptions{}, torch::kFloat32, 1e-5, {"fc1", "fc2"});
  TinyNet model;
  FsdpOptions o;
  o.units = {"fc1", "fc2"};  // "side" is in no unit
  FullyShardedDataParallel fsdp(test::world(), *model, o);
  EXPECT_EQ(fsdp.root_parameter_names(), (std::vector<std::string>{"side.weight", "side.bias"}));
}

// Tied: one tensor under a name in each of two units. It is one parameter (one gradient reduction, one piece
// set), held by the root; training equals the untied reference whose two uses share the weight.
struct LinearOf : torch::nn::Module {
  explicit LinearOf(const torch::Tensor& w) {
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", torch::randn({w.size(0)}) * 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};
struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl() {
    const torch::Tensor w = torch::randn({8, 8}) * 0.3;
    a = register_module("a", std::make_shared<LinearOf>(w));
    b = register_module("b", std::make_shared<LinearOf>(w));  // b.weight is a.weight: one tensor, two names
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto run = [&](const char* unit, const std::function<torch::Tensor()>& f) {
      return fsdp ? fsdp->run_unit(unit, f) : f();
    };
    auto h = run("a", [&] { return torch::tanh(a->forward(x)); });
    return run("b", [&] { return b->forward(h); });
  }
  FullyShardedDataParallel* fsdp = nullptr;
  std::shared_ptr<LinearOf> a, b;
};
TORCH_MODULE(TiedNet);

TEST(Ddp, Stage3TiedWeightIsOneParameterInTheRoot) {
  auto& comm = test::world();
  const int n = comm.size(), r = comm.rank();
  torch::manual_seed(7);
  TiedNet model, ref;
  {
    torch::NoGradGuard g;
    auto from = unique_parameters(*model), to = unique_parameters(*ref);
    ASSERT_EQ(from.size(), 3u);  // a.weight (= b.weight), a.bias, b.bias
    for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  }
  FullyShardedDataParallel fsdp(comm, *model);
  model->fsdp = &fsdp;
  EXPECT_EQ(fsdp.parameters().size(), 3u);
  EXPECT_EQ(fsdp.root_parameter_names(), std::vector<std::string>{"a.weight"});
  ShardedOptimizer opt(fsdp, [](std::vector<torch::Tensor> p) { return make_opt(p, Opt::kAdam); });
  auto ref_opt = make_opt(unique_parameters(*ref), Opt::kAdam);
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = full_batch(step, 4 * n, torch::kFloat32);
    y = y.repeat({1, 2});
    fsdp.prepare_forward();
    auto out = fsdp.run_forward([&] { return model->forward(x.narrow(0, r * 4, 4)); });
    torch::mse_loss(out, y.narrow(0, r * 4, 4)).backward();
    fsdp.finish_backward();
    opt.step();
    opt.zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    ref_opt->step();
    ref_opt->zero_grad();
  }
  EXPECT_LT(max_rel_diff(fsdp.full_parameters(), unique_parameters(*ref)), 1e-5);
}

TEST(Ddp, Stage3RefusesBadUnitsAndViewsOnEveryRank) {
  auto& comm = test::world();
  const auto refused = [&](torch::nn::Module& m, std::vector<std::string> units, const std::string& needle) {
    FsdpOptions o;
    o.units = std::move(units);
    try {
      FullyShardedDataParallel fsdp(comm, m, o);
      ADD_FAILURE() << "expected an error containing: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TinyNet model;
  refused(*model, {"fc1", "nope"}, "unit 'nope' is not a submodule");
  torch::nn::ModuleList nested(torch::nn::ModuleList(torch::nn::Linear(4, 4)), torch::nn::Linear(4, 2));
  refused(*nested, {"0", "0.0"}, "unit '0.0' is inside unit '0'");
  struct Viewed : torch::nn::Module {
    Viewed() {
      auto whole = register_parameter("whole", torch::zeros({4, 4}));
      register_parameter("half", whole.detach().narrow(0, 0, 2));  // a view of another parameter's storage
    }
  };
  Viewed viewed;
  refused(viewed, {}, "'half' is a view of, or shares, another tensor's");
}

// A C++ model whose forward reads a unit's weights without run_unit: one error naming the unit, on every rank (each
// runs the same forward), before any step.
TEST(Ddp, Stage3RefusesAForwardThatSkipsRunUnit) {
  auto& comm = test::world();
  TinyNet model;
  FullyShardedDataParallel fsdp(comm, *model);
  fsdp.prepare_forward();
  try {
    fsdp.run_forward([&] { return model->body(torch::randn({2, 8}), true); });  // model->fsdp unset: no run_unit
    ADD_FAILURE() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("units not run in this forward: 'fc1', 'fc2', 'side'"), std::string::npos)
        << e.what();
  }
  for (const auto& p : model->parameters()) EXPECT_EQ(p.storage().nbytes(), 0u);  // nothing left gathered
}

// The size policy: top-down, a module under the limit (or a layer without children) is a unit.
TEST(Ddp, UnitsBySizeDescendIntoLargeContainers) {
  torch::nn::ModuleList blocks(torch::nn::ModuleList(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)),
                               torch::nn::ModuleList(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)),
                               torch::nn::Linear(8, 100));
  // 72 per Linear(8, 8), 900 for the last: the limit 150 keeps each block whole, the big layer alone.
  EXPECT_EQ(units_by_size(*blocks, 150), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(units_by_size(*blocks, 100), (std::vector<std::string>{"0.0", "0.1", "1.0", "1.1", "2"}));
  EXPECT_EQ(units_by_size(*blocks, 0), (std::vector<std::string>{"0", "1", "2"}));  // a quarter: 1188 / 4 = 297
}

// Element ranges: every row of every parameter on exactly one rank, each rank's share of each bucket within a
// row of the even split, the same layout on every rank, and a matrix larger than the rest split between ranks.
TEST(Ddp, PiecesTileEveryParameterAndSplitTheLargeMatrix) {
  auto& comm = test::world();
  const int n = comm.size();
  torch::nn::Sequential model(torch::nn::Linear(64, 200), torch::nn::ReLU(), torch::nn::Linear(200, 3));
  for (ShardStage stage : {ShardStage::kOptimizer, ShardStage::kGradients}) {
    ShardedDataParallel ddp(comm, *model, stage);
    const auto& params = ddp.parameters();
    // rows[r * P + i]: rows of parameter i rank r owns; first[r * P + i]: its first row (-1: none).
    std::vector<int64_t> rows(params.size() * n, 0), first(params.size() * n, -1), mine(params.size(), 0),
        start(params.size(), -1);
    int64_t owned = 0;
    for (const auto& piece : ddp.owned_pieces()) {
      mine[piece.index] = piece.row_end - piece.row_begin;
      start[piece.index] = piece.row_begin;
      owned += piece.tensor.numel();
      EXPECT_EQ(
          piece.tensor.data_ptr<float>(),
          params[piece.index].data_ptr<float>() +
              piece.row_begin * (params[piece.index].numel() / std::max<int64_t>(1, params[piece.index].size(0))));
    }
    comm.allgather(mine.data(), rows.data(), mine.size(), DType::kI64);
    comm.allgather(start.data(), first.data(), start.size(), DType::kI64);
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<std::pair<int64_t, int64_t>> pieces;
      for (int r = 0; r < n; ++r)
        if (rows[r * params.size() + i] > 0)
          pieces.emplace_back(first[r * params.size() + i], rows[r * params.size() + i]);
      std::sort(pieces.begin(), pieces.end());
      int64_t next = 0;
      for (const auto& [b, count] : pieces) {
        EXPECT_EQ(b, next) << ddp.parameter_names()[i] << ": rows owned twice or by nobody";
        next = b + count;
      }
      EXPECT_EQ(next, params[i].dim() ? params[i].size(0) : 1) << ddp.parameter_names()[i];
    }
    // 64*200 of 13,403 elements: more than half in one matrix, yet every rank owns about 1/n of them.
    int64_t total = 0;
    for (const auto& p : params) total += p.numel();
    std::vector<int64_t> owned_by(n);
    comm.allgather(&owned, owned_by.data(), 1, DType::kI64);
    for (int r = 0; r < n; ++r)
      EXPECT_NEAR(static_cast<double>(owned_by[r]), static_cast<double>(total) / n, 200.0 * ddp.buckets().size())
          << "rank " << r;
    int splits = 0;  // ranks owning rows of the [200, 64] matrix
    for (int r = 0; r < n; ++r) splits += rows[r * params.size()] > 0;
    EXPECT_GE(splits, std::min(n, 3));
  }
}

TEST(Ddp, SplitBucketCutsBetweenRowsNearTheEvenSplit) {
  // One 10-row matrix of 8-element rows and a 4-element vector: 84 elements between 4 ranks (21 each).
  EXPECT_EQ(split_bucket({80, 4}, {8, 1}, 4), (std::vector<int64_t>{0, 24, 40, 64, 84}));
  EXPECT_EQ(split_bucket({80, 4}, {8, 1}, 1), (std::vector<int64_t>{0, 84}));
  EXPECT_EQ(split_bucket({3}, {1}, 4), (std::vector<int64_t>{0, 0, 1, 2, 3}));  // fewer rows than ranks
  EXPECT_EQ(split_bucket({0, 6}, {5, 2}, 2), (std::vector<int64_t>{0, 4, 6}));  // a tie rounds up
}

TEST(Ddp, BucketsLaunchDuringBackward) {
  auto& comm = test::world();
  TinyNet model;
  DistributedDataParallel ddp(comm, *model, small_buckets());
  ASSERT_GE(ddp.buckets().size(), 3u);
  // The first bucket holds the last-registered parameters (reverse order).
  EXPECT_EQ(ddp.buckets().front().params.front(), ddp.parameters().size() - 1);
  auto x = torch::randn({4, 8});
  ddp.prepare_forward();
  model->forward(x).sum().backward();
  ddp.finish_backward();
  EXPECT_EQ(ddp.stats().buckets_launched, ddp.buckets().size());
  EXPECT_EQ(ddp.stats().buckets_launched_in_backward, ddp.buckets().size());
}

TEST(Ddp, DifferentModelRaisesOnAllRanks) {
  auto& comm = test::world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const bool odd_one = comm.rank() == comm.size() - 1;
  TinyNet model(odd_one ? 17 : 16);
  try {
    DistributedDataParallel ddp(comm, *model);
    ADD_FAILURE() << "no error on rank " << comm.rank();
  } catch (const DisagreementError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fc1.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(comm.size() - 1)), std::string::npos) << msg;
    EXPECT_NE(msg.find("[17, 8]"), std::string::npos) << msg;
  }
  // The communicator is still usable: nobody is stuck in a collective.
  EXPECT_TRUE(comm.all_ok(true));
}

TEST(Ddp, NoSyncAccumulationEqualsLargeBatch) {
  auto& comm = test::world();
  const int n = comm.size(), r = comm.rank();
  const int64_t b = 2, micro = 3;
  torch::manual_seed(7 + r);
  TinyNet model(16, false, torch::kFloat64);
  DistributedDataParallel ddp(comm, *model, small_buckets());
  TinyNet ref(16, false, torch::kFloat64);
  copy_params(*model, *ref);
  for (int step = 0; step < 2; ++step) {  // twice: the second step accumulates into bucket views
    auto [x, y] = full_batch(step, n * b * micro, torch::kFloat64);
    auto chunk = [&](int64_t k, int rank) {
      return std::make_pair(x.narrow(0, (k * n + rank) * b, b), y.narrow(0, (k * n + rank) * b, b));
    };
    for (int64_t k = 0; k < micro; ++k) {
      auto [cx, cy] = chunk(k, r);
      if (k + 1 < micro) {
        auto guard = ddp.no_sync();
        ddp.prepare_forward();
        torch::mse_loss(model->forward(cx), cy).backward();
        ddp.finish_backward();
      } else {
        ddp.prepare_forward();
        torch::mse_loss(model->forward(cx), cy).backward();
        ddp.finish_backward();
      }
    }
    // Reference: sum of every (rank, micro-batch) gradient, averaged over ranks.
    for (int64_t k = 0; k < micro; ++k)
      for (int rr = 0; rr < n; ++rr) {
        auto [cx, cy] = chunk(k, rr);
        torch::mse_loss(ref->forward(cx), cy).backward();
      }
    auto p = model->parameters(), q = ref->parameters();
    for (size_t i = 0; i < p.size(); ++i) {
      auto expect = q[i].grad() / n;
      EXPECT_TRUE(torch::allclose(p[i].grad(), expect, 1e-10, 1e-12)) << "param " << i << " step " << step;
    }
    EXPECT_TRUE(comm.agree(hash_params(*model)));
    for (auto& t : model->parameters()) t.mutable_grad().zero_();
    for (auto& t : ref->parameters()) t.mutable_grad().zero_();
  }
}

TEST(Ddp, BuffersBroadcastFromRankZero) {
  auto& comm = test::world();
  const int r = comm.rank();
  torch::manual_seed(100 + r);
  TinyNet model(16, /*with_bn=*/true);
  DistributedDataParallel ddp(comm, *model);
  auto stats_hash = [&] {
    auto m = model->bn->running_mean.contiguous();
    uint64_t h = 0;
    std::memcpy(&h, m.data_ptr(), sizeof(h));
    return h ^ static_cast<uint64_t>(model->bn->num_batches_tracked.item<int64_t>());
  };
  EXPECT_TRUE(comm.agree(stats_hash())) << "buffers not broadcast at construction";
  for (int step = 0; step < 3; ++step) {
    ddp.prepare_forward();
    EXPECT_TRUE(comm.agree(stats_hash())) << "buffers differ after prepare_forward, step " << step;
    // Different data per rank: running statistics diverge during forward.
    auto x = torch::randn({5, 8}) * (1.0 + r);
    model->forward(x).sum().backward();
    ddp.finish_backward();
    if (comm.size() > 1) {
      EXPECT_FALSE(comm.agree(stats_hash()));
    }
  }
  // They equal rank 0's after the next prepare_forward.
  auto mine = model->bn->running_var.clone();
  ddp.prepare_forward();
  auto root = model->bn->running_var.clone();
  comm.broadcast(mine.data_ptr(), mine.numel(), DType::kF32, 0);
  EXPECT_TRUE(torch::equal(root, mine));
}

TEST(Ddp, UnusedParameterIsAnErrorNamingIt) {
  auto& comm = test::world();
  TinyNet model;
  DistributedDataParallel ddp(comm, *model);
  auto x = torch::randn({4, 8});
  // Unused only on the last rank: every rank must still get the error (and nobody hangs).
  const bool skip = comm.rank() == comm.size() - 1;
  ddp.prepare_forward();
  model->forward(x, /*use_side=*/!skip).sum().backward();
  try {
    ddp.finish_backward();
    ADD_FAILURE() << "no error on rank " << comm.rank();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("side.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("side.bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(comm.size() - 1)), std::string::npos) << msg;
  }
  // The wrapper is usable again for a normal step.
  ddp.prepare_forward();
  model->forward(x).sum().backward();
  EXPECT_NO_THROW(ddp.finish_backward());
}

TEST(Ddp, FindUnusedParametersMatchesReference) {
  auto& comm = test::world();
  const int n = comm.size(), r = comm.rank();
  DdpOptions o = small_buckets();
  o.find_unused_parameters = true;
  torch::manual_seed(3);
  TinyNet model(16, false, torch::kFloat64);
  DistributedDataParallel ddp(comm, *model, o);
  TinyNet ref(16, false, torch::kFloat64);
  copy_params(*model, *ref);
  auto [x, y] = full_batch(0, 2 * n, torch::kFloat64);
  // `side` is used on rank 0 only; its averaged gradient is rank 0's gradient / N.
  ddp.prepare_forward();
  torch::mse_loss(model->forward(x.narrow(0, 2 * r, 2), r == 0), y.narrow(0, 2 * r, 2)).backward();
  ddp.finish_backward();
  for (int rr = 0; rr < n; ++rr)
    torch::mse_loss(ref->forward(x.narrow(0, 2 * rr, 2), rr == 0), y.narrow(0, 2 * rr, 2)).backward();
  auto p = model->parameters(), q = ref->parameters();
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_TRUE(torch::allclose(p[i].grad(), q[i].grad() / n, 1e-10, 1e-12)) << "param " << i;

  // Unused on every rank: the undefined .grad of a fresh model stays undefined, as in PyTorch.
  TinyNet fresh(16, false, torch::kFloat64);
  DistributedDataParallel ddp2(comm, *fresh, o);
  ddp2.prepare_forward();
  fresh->forward(x, false).sum().backward();
  ddp2.finish_backward();
  EXPECT_FALSE(fresh->side->weight.grad().defined());
  EXPECT_TRUE(fresh->fc1->weight.grad().defined());
}

TEST(Ddp, BackwardWithoutPrepareForwardIsAnError) {
  auto& comm = test::world();
  TinyNet model;
  DistributedDataParallel ddp(comm, *model);
  EXPECT_THROW(model->forward(torch::randn({2, 8})).sum().backward(), std::exception);
}

}  // namespace
}  // namespace h5ddp

// DistributedDataParallel: N ranks with per-rank batch b must train exactly like 1 rank with batch N*b.
// Every rank computes the 1-rank reference locally (a copy of the model, the full batch), so the test needs
// no other process and compares with a tolerance; parameters must also be bitwise identical across ranks.
#include "h5ddp/ddp.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "h5ddp/error.hpp"
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
    auto h = fc1->forward(x);
    if (bn) h = bn->forward(h);
    auto y = fc2->forward(torch::tanh(h));
    return use_side ? y + side->forward(x) : y;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, side{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(TinyNet);

uint64_t hash_params(torch::nn::Module& m) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : m.parameters()) {
    auto c = p.detach().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

void copy_params(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard g;
  auto a = from.parameters(), b = to.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

double max_rel_diff(torch::nn::Module& a, torch::nn::Module& b) {
  double worst = 0;
  auto pa = a.parameters(), pb = b.parameters();
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

// With options.shard_optimizer a ShardedOptimizer holds this rank's parameters only and its step() gathers the
// others' (ZeRO-1); the result must still be the large-batch reference's.
void run_equivalence(Opt opt_kind, DdpOptions options, torch::Dtype dtype, double tol) {
  auto& comm = test::world();
  const int n = comm.size(), r = comm.rank();
  const int64_t b = 3;
  torch::manual_seed(1000 + r);  // ranks start different: the constructor's broadcast must fix that
  TinyNet model(16, false, dtype);
  DistributedDataParallel ddp(comm, *model, options);
  TinyNet ref(16, false, dtype);
  copy_params(*model, *ref);
  std::unique_ptr<ShardedOptimizer> sharded_opt;
  std::unique_ptr<torch::optim::Optimizer> plain_opt;
  if (options.shard_optimizer)
    sharded_opt =
        std::make_unique<ShardedOptimizer>(ddp, [&](std::vector<torch::Tensor> p) { return make_opt(p, opt_kind); });
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

    ASSERT_TRUE(comm.agree(hash_params(*model))) << "parameters differ across ranks after step " << step;
  }
  const double diff = max_rel_diff(*model, *ref);
  EXPECT_LT(diff, tol) << "after 20 steps, N=" << n;
  EXPECT_EQ(ddp.stats().steps, 20u);
  EXPECT_EQ(ddp.stats().buckets_launched, 20u * ddp.buckets().size());
  if (options.shard_optimizer) {
    // Each parameter's state on exactly one rank, and this rank's on its own parameters only.
    int64_t held = static_cast<int64_t>(opt.state().size());
    EXPECT_EQ(held, static_cast<int64_t>(ddp.owned_parameters().size()));
    comm.allreduce(&held, 1, DType::kI64, ReduceOp::kSum);
    EXPECT_EQ(held, static_cast<int64_t>(model->parameters().size()));
    if (n > 1) EXPECT_LT(ddp.owned_parameters().size(), model->parameters().size());
    for (const auto& p : model->parameters()) EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  }
}

DdpOptions sharded(DdpOptions o) {
  o.shard_optimizer = true;
  return o;
}

DdpOptions small_buckets() {
  DdpOptions o;
  o.first_bucket_bytes = 64;  // several buckets even for this tiny model
  o.bucket_cap_bytes = 300;
  return o;
}

TEST(Ddp, SgdMomentumMatchesLargeBatch) {
  run_equivalence(Opt::kSgdMomentum, small_buckets(), torch::kFloat32, 1e-5);
}
TEST(Ddp, AdamMatchesLargeBatch) {
  run_equivalence(Opt::kAdam, small_buckets(), torch::kFloat32, 1e-5);
}
TEST(Ddp, SgdMomentumMatchesLargeBatchFloat64) {
  run_equivalence(Opt::kSgdMomentum, DdpOptions{}, torch::kFloat64, 1e-6);
}
TEST(Ddp, AdamMatchesLargeBatchFloat64) {
  run_equivalence(Opt::kAdam, small_buckets(), torch::kFloat64, 1e-6);
}

TEST(Ddp, ShardedAdamMatchesLargeBatch) {
  run_equivalence(Opt::kAdam, sharded(small_buckets()), torch::kFloat32, 1e-5);
}
TEST(Ddp, ShardedSgdMomentumMatchesLargeBatchFloat64) {
  run_equivalence(Opt::kSgdMomentum, sharded(DdpOptions{}), torch::kFloat64, 1e-6);
}

TEST(Ddp, ShardedOptimizerRefusesAReplicatedDdp) {
  auto& comm = test::world();
  TinyNet model;
  DistributedDataParallel ddp(comm, *model);
  EXPECT_THROW(ShardedOptimizer(ddp, [](std::vector<torch::Tensor> p) { return make_opt(p, Opt::kAdam); }),
               ConfigError);
}

// Shards are whole parameters balanced by bytes, the same on every rank; owners lay out each bucket by rank.
TEST(Ddp, ShardOwnersAreBalancedAndAgreed) {
  auto& comm = test::world();
  TinyNet model(64);
  DistributedDataParallel ddp(comm, *model, sharded(small_buckets()));
  const auto& owners = ddp.parameter_owners();
  ASSERT_EQ(owners.size(), ddp.parameters().size());
  uint64_t h = 0;
  for (int o : owners) h = h * 31 + static_cast<uint64_t>(o);
  EXPECT_TRUE(comm.agree(h));
  for (const auto& spec : ddp.buckets())
    EXPECT_TRUE(std::is_sorted(spec.params.begin(), spec.params.end(),
                               [&](size_t a, size_t b) { return owners[a] < owners[b]; }));
  std::vector<size_t> bytes;
  for (const auto& p : ddp.parameters()) bytes.push_back(p.nbytes());
  EXPECT_EQ(owners, assign_shards(bytes, comm.size()));
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

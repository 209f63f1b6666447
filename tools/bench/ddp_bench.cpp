// h5ddp-bench-ddp: step time of a local step (no communication) vs a DistributedDataParallel step, and of
// the bucket allreduces alone, for the default CNN or a large MLP. Prints one RESULT line (rank 0) that
// tools/bench/ddp_bench.sh puts side by side with PyTorch DDP (tools/bench/ddp_bench.py, same models).
//
//   mpirun -np 2 h5ddp-bench-ddp --model mlp --hidden 4096 --layers 4 --batch 16 --steps 5
//
// Step = forward + cross-entropy + backward (+ finish_backward) + SGD step + zero_grad, on synthetic data.
// Time per step = (barrier .. S steps .. barrier) / S, i.e. the slowest rank.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "h5ddp/ddp.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"

namespace {

using namespace h5ddp;

// Same layers as the trainer's default CNN (docs/MODELS.md) and as ddp_bench.py.
struct BenchCnnImpl : torch::nn::Module {
  BenchCnnImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)));
    fc1 = register_module("fc1", torch::nn::Linear(64 * 5 * 5, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    x = torch::dropout(x, 0.25, is_training()).flatten(1);
    x = torch::dropout(torch::relu(fc1->forward(x)), 0.5, is_training());
    return fc2->forward(x);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(BenchCnn);

struct BenchMlpImpl : torch::nn::Module {
  BenchMlpImpl(int64_t hidden, int layers) {
    int64_t in = 784;
    for (int i = 0; i < layers; ++i) {
      fcs.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(in, hidden)));
      in = hidden;
    }
    fcs.push_back(register_module("fc" + std::to_string(layers + 1), torch::nn::Linear(in, 10)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x.flatten(1);
    for (size_t i = 0; i + 1 < fcs.size(); ++i) x = torch::relu(fcs[i]->forward(x));
    return fcs.back()->forward(x);
  }
  std::vector<torch::nn::Linear> fcs;
};
TORCH_MODULE(BenchMlp);

struct Options {
  std::string model = "cnn";
  int64_t hidden = 4096;
  int layers = 4;
  int64_t batch = 64;  // per rank
  int steps = 20;
  int warmup = 3;
  size_t bucket_cap_mb = 25;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError("missing value after " + a);
      return argv[++i];
    };
    if (a == "--model")
      o.model = next();
    else if (a == "--hidden")
      o.hidden = std::stoll(next());
    else if (a == "--layers")
      o.layers = std::stoi(next());
    else if (a == "--batch")
      o.batch = std::stoll(next());
    else if (a == "--steps")
      o.steps = std::stoi(next());
    else if (a == "--warmup")
      o.warmup = std::stoi(next());
    else if (a == "--bucket-cap-mb")
      o.bucket_cap_mb = std::stoul(next());
    else
      throw ConfigError("unknown option " + a + " (see the comment at the top of ddp_bench.cpp)");
  }
  if (o.model != "cnn" && o.model != "mlp") throw ConfigError("--model must be cnn or mlp");
  return o;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A barrier that sleeps instead of spinning (Open MPI's MPI_Barrier busy-polls): a rank that finishes
// early must not take CPU from the ranks still computing on an oversubscribed machine. gloo's barrier,
// which the PyTorch side uses, sleeps too.
void quiet_barrier(MpiComm& comm) {
  MPI_Request r;
  H5DDP_CHECK_MPI(MPI_Ibarrier(comm.handle(), &r));
  for (int done = 0; !done;) {
    H5DDP_CHECK_MPI(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

template <class Step>
double time_steps(MpiComm& comm, int warmup, int steps, Step&& step) {
  for (int i = 0; i < warmup; ++i) step();
  quiet_barrier(comm);
  const double t0 = now();
  for (int i = 0; i < steps; ++i) step();
  quiet_barrier(comm);
  return (now() - t0) / steps;
}

int run(const Options& o, MpiEnv& env) {
  at::set_num_threads(1);
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  torch::manual_seed(1);
  std::shared_ptr<torch::nn::Module> model;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  if (o.model == "cnn") {
    BenchCnn m;
    model = m.ptr();
    forward = [m](const torch::Tensor& x) mutable { return m->forward(x); };
  } else {
    BenchMlp m(o.hidden, o.layers);
    model = m.ptr();
    forward = [m](const torch::Tensor& x) mutable { return m->forward(x); };
  }
  int64_t nparams = 0;
  for (const auto& p : model->parameters()) nparams += p.numel();
  auto x = torch::randn({o.batch, 1, 28, 28});
  auto y = torch::randint(0, 10, {o.batch}, torch::kLong);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));

  // Per-phase times of this rank (H5DDP_BENCH_PHASES=1 prints them for every rank): where a DDP step's
  // extra time goes, rank by rank.
  const bool phases = std::getenv("H5DDP_BENCH_PHASES") != nullptr;
  double ph[2][4] = {};  // [local|ddp][forward, backward, finish, step]
  auto lap = [&](double& acc, double& t) {
    const double n = now();
    acc += n - t;
    t = n;
  };
  // (a) local step: every rank trains alone, at the same time (same CPU contention as the DDP step).
  const double t_local = time_steps(*comm, o.warmup, o.steps, [&] {
    double t = now();
    auto loss = torch::nll_loss(torch::log_softmax(forward(x), 1), y);
    lap(ph[0][0], t);
    loss.backward();
    lap(ph[0][1], t);
    opt.step();
    opt.zero_grad();
    lap(ph[0][3], t);
  });

  DdpOptions dopt;
  dopt.bucket_cap_bytes = o.bucket_cap_mb << 20;
  DistributedDataParallel ddp(*comm, *model, dopt);
  // (b) DDP step.
  const double t_ddp = time_steps(*comm, o.warmup, o.steps, [&] {
    double t = now();
    ddp.prepare_forward();
    auto loss = torch::nll_loss(torch::log_softmax(forward(x), 1), y);
    lap(ph[1][0], t);
    loss.backward();
    lap(ph[1][1], t);
    ddp.finish_backward();
    lap(ph[1][2], t);
    opt.step();
    opt.zero_grad();
    lap(ph[1][3], t);
  });
  if (phases) {
    const double n = o.warmup + o.steps;
    std::fprintf(
        stderr, "PHASES rank=%d local: fwd=%.1f bwd=%.1f step=%.1f | ddp: fwd=%.1f bwd=%.1f finish=%.1f step=%.1f ms\n",
        env.rank(), 1e3 * ph[0][0] / n, 1e3 * ph[0][1] / n, 1e3 * ph[0][3] / n, 1e3 * ph[1][0] / n, 1e3 * ph[1][1] / n,
        1e3 * ph[1][2] / n, 1e3 * ph[1][3] / n);
  }
  const auto st = ddp.stats();

  // (c) the same bucket allreduces with nothing else running: the communication there is to hide.
  std::vector<torch::Tensor> bufs;
  for (const auto& b : ddp.buckets()) bufs.push_back(torch::zeros({static_cast<int64_t>(b.bytes / 4)}));
  const double t_comm = time_steps(*comm, 1, std::max(3, o.steps / 2), [&] {
    std::vector<std::unique_ptr<Work>> w;
    for (auto& b : bufs) w.push_back(comm->allreduce_async(b.data_ptr(), b.numel(), DType::kF32, ReduceOp::kSum));
    for (auto& k : w) k->wait();
  });

  // Hidden fraction, two ways: from the step times (noisy on a loaded machine: includes any DDP overhead
  // and stragglers) and from the time finish_backward still waited for allreduces after backward ended.
  const double exposed = std::max(0.0, t_ddp - t_local);
  const double wait = st.comm_wait_seconds / std::max<size_t>(1, st.steps);
  const bool multi = env.size() > 1 && t_comm > 0;
  const double hidden = multi ? std::clamp(1.0 - exposed / t_comm, 0.0, 1.0) : 0.0;
  const double hidden_wait = multi ? std::clamp(1.0 - wait / t_comm, 0.0, 1.0) : 0.0;
  if (env.rank() == 0) {
    std::printf(
        "RESULT impl=h5ddp model=%s ranks=%d params=%lld batch=%lld buckets=%zu local_ms=%.3f ddp_ms=%.3f "
        "comm_ms=%.3f hidden=%.2f hidden_wait=%.2f wait_ms=%.3f in_backward=%.2f async=%s waiting=%s\n",
        o.model.c_str(), env.size(), static_cast<long long>(nparams), static_cast<long long>(o.batch),
        ddp.buckets().size(), 1e3 * t_local, 1e3 * t_ddp, 1e3 * t_comm, hidden, hidden_wait, 1e3 * wait,
        st.buckets_launched ? double(st.buckets_launched_in_backward) / st.buckets_launched : 0.0,
        comm->async_mode_name().c_str(), comm->sleeps_while_waiting() ? "sleep" : "spin");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  h5ddp::MpiEnv env(&argc, &argv);
  try {
    return run(parse(argc, argv), env);
  } catch (const std::exception& e) {
    h5ddp::die_with_exception(e);
  }
}

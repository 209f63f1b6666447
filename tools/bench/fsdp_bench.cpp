// h5ddp-bench-fsdp: training step time of ZeRO-3 with and without prefetch (FsdpOptions::prefetch, --shard-prefetch)
// against replicated training, in one MPI job: the configurations are built side by side (each its own copy of the
// model, built as h5ddp-train builds it: build_train_model + ParallelModel) and take turns, round by round, in a
// rotating order, so that they share the machine's state. Per configuration: the median step time, and for stage 3
// the time the step spent gathering (blocking gathers and waits for prefetched ones, Stats::gather_seconds) and
// the gathers per step. Rank 0 prints RESULT lines (tools/bench/fsdp_bench.sh makes the table of
// docs/BENCHMARKS_TRAINING.md "ZeRO-3 prefetch").
//
//   mpirun -np N h5ddp-bench-fsdp [--model mlp|gpt] [--hidden 4256,4256,...] [--model-file gpt.pt]
//       [--unit-params 0] [--batch 8] [--steps 3] [--rounds 3] [--warmup 2] [--configs replicated,prefetch,blocking]
// A configuration may name MpiComm's async mode: prefetch:thread, blocking:progress, ... (default: MpiComm's choice).
//
// --model mlp: h5ddp-train's MLP (784 -> hidden... -> 10; units: its layers); --model gpt: --model-file, a scripted
// gpt.py GPT (units by size, --unit-params as --shard-unit-params). --batch: rows per rank. SGD with momentum.
// The heap is tuned as h5ddp-train tunes it under --shard (1 MiB mmap threshold), for every configuration.
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "h5ddp/data_parallel.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "train/parallel_model.hpp"

namespace {

using namespace h5ddp;

struct Setup {
  std::string name;  // replicated | prefetch | blocking, optionally :thread | :progress | :nonblocking (async mode)
  MpiComm::AsyncMode mode = MpiComm::AsyncMode::kThread;
  TrainConfig config;
  TrainModel model;
  std::unique_ptr<ParallelModel> parallel;
  std::vector<double> step_seconds;
  double gather_seconds = 0;
  size_t unit_gathers = 0, prefetched = 0, steps = 0;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One training step as h5ddp-train takes it (prepare_forward, forward, loss, backward, finish_backward, step).
void train_step(Setup& s, const std::string& model, const torch::Tensor& x, const torch::Tensor& y) {
  DataParallel& dp = s.parallel->wrapper();
  dp.prepare_forward();
  const torch::Tensor out = s.parallel->forward(x);
  const torch::Tensor loss = model == "gpt" ? torch::cross_entropy_loss(out.reshape({-1, out.size(-1)}), y.reshape(-1))
                                            : torch::cross_entropy_loss(out, y);
  loss.backward();
  dp.finish_backward();
  s.parallel->step(s.config.lr);
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnv env(&argc, &argv);
  std::map<std::string, std::string> opt{{"model", "mlp"},
                                         {"hidden", "4256,4256,4256,4256,4256,4256,4256,4256"},
                                         {"model-file", "gpt.pt"},
                                         {"unit-params", "0"},
                                         {"batch", "8"},
                                         {"steps", "3"},
                                         {"rounds", "3"},
                                         {"warmup", "2"},
                                         {"configs", "replicated,prefetch,blocking"}};
  for (int i = 1; i + 1 < argc; i += 2) opt[std::string(argv[i]).substr(2)] = argv[i + 1];
  torch::set_num_threads(1);
  auto comm = MpiComm::dup(MPI_COMM_WORLD);
  const int rank = comm->rank(), np = comm->size();
  const std::string model = opt["model"];
  const int64_t batch = std::stoll(opt["batch"]);
  const int steps = std::stoi(opt["steps"]), rounds = std::stoi(opt["rounds"]), warmup = std::stoi(opt["warmup"]);

  TrainConfig heap;
  heap.shard = ShardOption::kParameters;
  ParallelModel::tune_heap(heap);

  std::vector<std::unique_ptr<Setup>> setups;
  for (const std::string& name : split(opt["configs"])) {
    auto s = std::make_unique<Setup>();
    s->name = name;
    const std::string base = name.substr(0, name.find(':'));
    const std::string mode = name.find(':') == std::string::npos ? "" : name.substr(name.find(':') + 1);
    s->mode = mode == "thread"        ? MpiComm::AsyncMode::kThread
              : mode == "progress"    ? MpiComm::AsyncMode::kProgress
              : mode == "nonblocking" ? MpiComm::AsyncMode::kNonBlocking
                                      : comm->async_mode();
    TrainConfig& c = s->config;
    c.optimizer = OptimizerKind::kSgd;
    c.lr = 1e-3;
    c.shard = base == "replicated" ? ShardOption::kNone : ShardOption::kParameters;
    c.shard_prefetch = base == "prefetch";
    c.shard_unit_params = std::stoll(opt["unit-params"]);
    c.model.dropout = 0;
    if (model == "gpt") {
      c.model.file = opt["model-file"];
    } else {
      c.model.name = "mlp";
      c.model.mlp_hidden.clear();
      for (const auto& h : split(opt["hidden"])) c.model.mlp_hidden.push_back(std::stoll(h));
    }
    torch::manual_seed(0);
    s->model = build_train_model(c.model);
    s->parallel = std::make_unique<ParallelModel>(c, *comm, s->model, Compute{}, nullptr);
    setups.push_back(std::move(s));
  }

  // The same batch every step (the data path is not measured): images and labels, or tokens and next tokens.
  torch::manual_seed(100 + rank);
  torch::Tensor x, y;
  if (model == "gpt") {
    const auto tokens = torch::randint(0, 256, {batch, 65}, torch::kLong);
    x = tokens.narrow(1, 0, 64).contiguous();
    y = tokens.narrow(1, 1, 64).contiguous();
  } else {
    x = torch::randn({batch, 784});
    y = torch::randint(0, 10, {batch}, torch::kLong);
  }

  using Clock = std::chrono::steady_clock;
  const size_t n = setups.size();
  const MpiComm::AsyncMode default_mode = comm->async_mode();
  if (rank == 0) std::printf("# async mode by default: %s\n", comm->async_mode_name().c_str());
  for (size_t k = 0; k < n; ++k) {  // the first forward records the unit order; memory first touched
    comm->set_async_mode(setups[k]->mode);
    for (int w = 0; w < warmup; ++w) train_step(*setups[k], model, x, y);
  }
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < n; ++k) {
      Setup& s = *setups[(k + static_cast<size_t>(r)) % n];
      comm->set_async_mode(s.mode);  // nothing is in flight between steps
      const DataParallel::Stats before = s.parallel->wrapper().stats();
      comm->barrier();
      for (int i = 0; i < steps; ++i) {
        const auto t0 = Clock::now();
        train_step(s, model, x, y);
        double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        comm->allreduce(&dt, 1, DType::kF64, ReduceOp::kMax);  // the slowest rank's step
        s.step_seconds.push_back(dt);
      }
      const DataParallel::Stats& after = s.parallel->wrapper().stats();
      s.gather_seconds += after.gather_seconds - before.gather_seconds;
      s.unit_gathers += after.unit_gathers - before.unit_gathers;
      s.prefetched += after.prefetched - before.prefetched;
      s.steps += static_cast<size_t>(steps);
    }
  }

  comm->set_async_mode(default_mode);
  if (rank == 0) {
    std::map<std::string, double> med;
    for (const auto& s : setups) {
      med[s->name] = median(s->step_seconds);
      const double per = s->steps ? 1.0 / static_cast<double>(s->steps) : 0.0;
      std::printf(
          "RESULT model=%s np=%d config=%s steps=%zu median_ms=%.1f min_ms=%.1f max_ms=%.1f gather_ms_per_step=%.1f "
          "unit_gathers_per_step=%.2f prefetched_per_step=%.2f ms_per_unit_gather=%.2f\n",
          model.c_str(), np, s->name.c_str(), s->steps, 1e3 * med[s->name],
          1e3 * *std::min_element(s->step_seconds.begin(), s->step_seconds.end()),
          1e3 * *std::max_element(s->step_seconds.begin(), s->step_seconds.end()), 1e3 * s->gather_seconds * per,
          static_cast<double>(s->unit_gathers) * per, static_cast<double>(s->prefetched) * per,
          s->unit_gathers ? 1e3 * s->gather_seconds / static_cast<double>(s->unit_gathers) : 0.0);
    }
    const auto ratio = [&](const char* a, const char* b) {
      if (med.count(a) && med.count(b) && med[b] > 0)
        std::printf("RATIO model=%s np=%d %s/%s=%.3f\n", model.c_str(), np, a, b, med[a] / med[b]);
    };
    ratio("prefetch", "blocking");
    ratio("prefetch", "replicated");
    ratio("blocking", "replicated");
    std::fflush(stdout);
  }
  return 0;
}

// h5ddp-bench-load: what one load asks of the checkpoint file per rank (issue 59, docs/SCALING.md).
//   h5ddp-bench-load --make FILE --tensors T --gib G     write a checkpoint of T tensors (a third weights, a third each
//                                                         Adam moment, plus one Adam step per parameter) of G GiB
//   h5ddp-bench-load FILE [--strategy every|share] [--reps N]
//                                                         load it N times into destinations sized from its manifest
// Each load prints, per rank, its HDF5 opens of the file and its coalesced read calls (the library's counters),
// and one RESULT line with the slowest rank's seconds. tools/bench/load_reads.sh runs it under strace to count every
// read system call on the file (HDF5's included).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <list>
#include <string>
#include <vector>

#include "checkpoint/direct_read.hpp"
#include "checkpoint/reader.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"

using namespace h5ddp;

namespace {

struct Options {
  std::string file, make, strategy = "every";
  int tensors = 3000, reps = 1;
  double gib = 0.25;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (k == "--make")
      o.make = v, ++i;
    else if (k == "--tensors")
      o.tensors = std::max(3, std::stoi(v) / 3 * 3), ++i;
    else if (k == "--gib")
      o.gib = std::stod(v), ++i;
    else if (k == "--strategy")
      o.strategy = v, ++i;
    else if (k == "--reps")
      o.reps = std::max(1, std::stoi(v)), ++i;
    else
      o.file = k;
  }
  return o;
}

// Owns the bytes of a TrainState's refs.
struct Owned {
  TrainState state;
  std::list<std::vector<uint8_t>> bytes;
  TensorRef ref(const std::string& name, DType dtype, std::vector<int64_t> shape, uint8_t fill) {
    TensorRef t{name, dtype, std::move(shape), nullptr};
    auto& b = bytes.emplace_back(std::max<size_t>(t.nbytes(), 1), fill);
    t.data = b.data();
    return t;
  }
};

void make(MpiComm& comm, const Options& o) {
  Owned s;
  const int params = o.tensors / 3;
  const int64_t elems = std::max<int64_t>(1, static_cast<int64_t>(o.gib * (1 << 30) / 4 / 3 / params));
  ParamGroup g;
  g.hyper = {{"lr", 1e-3}, {"betas0", 0.9}, {"betas1", 0.999}, {"eps", 1e-8}, {"weight_decay", 0}, {"amsgrad", 0}};
  for (int i = 0; i < params; ++i) {
    const std::string p = "layer" + std::to_string(i) + ".weight";
    s.state.model.push_back(s.ref(p, DType::kF32, {elems}, static_cast<uint8_t>(i)));
    s.state.optimizer.state.push_back(s.ref(p + "/exp_avg", DType::kF32, {elems}, 1));
    s.state.optimizer.state.push_back(s.ref(p + "/exp_avg_sq", DType::kF32, {elems}, 2));
    s.state.optimizer.state.push_back(s.ref(p + "/step", DType::kI64, {}, 0));
    g.params.push_back(p);
  }
  s.state.optimizer.type = "adam";
  s.state.optimizer.groups = {g};
  s.state.counters.step = 1;
  s.state.rng.cpu.assign(16, static_cast<uint8_t>(comm.rank()));
  const auto slash = o.make.rfind('/');
  SaveOptions so;
  so.name = slash == std::string::npos ? o.make : o.make.substr(slash + 1);
  so.update_latest = false;
  save_checkpoint(comm, s.state, slash == std::string::npos ? "." : o.make.substr(0, slash), so);
}

void load(MpiComm& comm, const Options& o) {
  for (int rep = 0; rep < o.reps; ++rep) {
    Owned s;
    LoadOptions lo;
    lo.strategy = o.strategy == "share" ? LoadStrategy::kShareExchange : LoadStrategy::kEveryRankReads;
    const int opens = ckpt::checkpoint_opens();
    const uint64_t reads = ckpt::coalesced_read_calls();
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    auto dst = [&](const CheckpointManifest& m) -> TrainState& {
      for (const auto& t : m.model) s.state.model.push_back(s.ref(t.name, t.dtype, t.shape, 0));
      for (const auto& t : m.optimizer_state) s.state.optimizer.state.push_back(s.ref(t.name, t.dtype, t.shape, 0));
      for (const auto& t : m.user) s.state.user.push_back(s.ref(t.name, t.dtype, t.shape, 0));
      return s.state;
    };
    load_checkpoint(comm, o.file, dst, lo);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    comm.allreduce(&secs, 1, DType::kF64, ReduceOp::kMax);
    std::printf("RANK rank=%d opens=%d coalesced_reads=%llu\n", comm.rank(), ckpt::checkpoint_opens() - opens,
                static_cast<unsigned long long>(ckpt::coalesced_read_calls() - reads));
    if (comm.rank() == 0)
      std::printf("RESULT op=load strategy=%s ranks=%d datasets=%zu seconds=%.4f\n", o.strategy.c_str(), comm.size(),
                  s.state.model.size() + s.state.optimizer.state.size() + s.state.user.size(), secs);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnv env(&argc, &argv);
  try {
    auto comm = MpiComm::dup(MPI_COMM_WORLD);
    const Options o = parse(argc, argv);
    if (!o.make.empty())
      make(*comm, o);
    else
      load(*comm, o);
    return 0;
  } catch (const std::exception& e) {
    die_with_exception(e);
  }
}

// h5ddp-bench-big-tensor: one tensor over 2 GiB saved and loaded (issue 42: MPI and HDF5 counts are int, so the
// 2 GiB boundary needs its own proof). Driver: tools/bench/big_tensor.sh (saves at N ranks, loads at M, verifies
// with h5ddp-ckpt and h5py). Too large for the CI machine's test suite at 4 ranks; results in docs/BENCHMARKS.md.
//   mpirun -np N h5ddp-bench-big-tensor save|load --dir D [--gib 2.1] [--sharded 0|1] [--write auto|mpiio]
// The state: model "huge.weight" (float32 [rows, 1024], replicated: each rank writes its rows) and, with --sharded 1,
// SGD's momentum_buffer of it held by the last rank only (sharded optimizer state: one rank writes all of it).
// Element i of huge.weight is float(i % 1000003), of the momentum buffer -float(i % 999983): load checks every one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"

using namespace h5ddp;

namespace {

struct Options {
  std::string op, dir = "/tmp/h5ddp-big";
  double gib = 2.1;
  bool sharded = false;
  WriteMode write = WriteMode::kAuto;
};

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 2) throw ConfigError("usage: h5ddp-bench-big-tensor save|load --dir D [--gib G] [--sharded 0|1]");
  o.op = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir")
      o.dir = v;
    else if (k == "--gib")
      o.gib = std::stod(v);
    else if (k == "--sharded")
      o.sharded = v == "1";
    else if (k == "--write")
      o.write = v == "mpiio" ? WriteMode::kMpiio : WriteMode::kAuto;
    else
      throw ConfigError("unknown option " + k);
  }
  return o;
}

float weight_at(size_t i) {
  return static_cast<float>(i % 1000003);
}
float momentum_at(size_t i) {
  return -static_cast<float>(i % 999983);
}

struct Big {
  Big(const Options& o, int rank, int world, bool fill) {
    rows = static_cast<int64_t>(o.gib * (1ull << 30) / 4096);
    const size_t n = static_cast<size_t>(rows) * 1024;
    weight.reset(new float[n]);
    if (fill)
      for (size_t i = 0; i < n; ++i) weight[i] = weight_at(i);
    state.model = {TensorRef{"huge.weight", DType::kF32, {rows, 1024}, weight.get()}};
    state.optimizer.type = "sgd";
    ParamGroup g;
    g.hyper = {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0}, {"weight_decay", 0}, {"nesterov", 0}};
    state.optimizer.sharded = o.sharded;
    if (o.sharded && rank == world - 1) {
      momentum.reset(new float[n]);
      if (fill)
        for (size_t i = 0; i < n; ++i) momentum[i] = momentum_at(i);
      state.optimizer.state = {TensorRef{"huge.weight/momentum_buffer", DType::kF32, {rows, 1024}, momentum.get()}};
    }
    if (!o.sharded || rank == world - 1) g.params = {"huge.weight"};
    state.optimizer.groups = {g};
    state.counters.step = 1;
    state.rng.cpu.assign(16, static_cast<uint8_t>(rank));
  }
  // Elements that differ from the pattern (every element checked).
  size_t wrong() const {
    size_t bad = 0;
    const size_t n = static_cast<size_t>(rows) * 1024;
    for (size_t i = 0; i < n; ++i) bad += weight[i] != weight_at(i);
    if (momentum)
      for (size_t i = 0; i < n; ++i) bad += momentum[i] != momentum_at(i);
    return bad;
  }
  int64_t rows = 0;
  std::unique_ptr<float[]> weight, momentum;
  TrainState state;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnv env(&argc, &argv);
  try {
    auto comm = MpiComm::dup(MPI_COMM_WORLD);
    const Options o = parse(argc, argv);
    Big big(o, comm->rank(), comm->size(), o.op == "save");
    comm->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    if (o.op == "save") {
      SaveOptions so;
      so.name = "big.h5";
      so.write_mode = o.write;
      const SaveResult r = save_checkpoint(*comm, big.state, o.dir, so);
      comm->barrier();
      if (comm->rank() == 0)
        std::printf("RESULT op=save ranks=%d sharded=%d write=%s bytes=%llu seconds=%.2f\n", comm->size(),
                    o.sharded ? 1 : 0, o.write == WriteMode::kMpiio ? "mpiio" : "direct",
                    static_cast<unsigned long long>(r.bytes), seconds_since(t0));
    } else {
      load_checkpoint(*comm, o.dir + "/big.h5", big.state);
      comm->barrier();
      const double s = seconds_since(t0);
      uint64_t bad = big.wrong();
      comm->allreduce(&bad, 1, DType::kU64, ReduceOp::kSum);
      if (comm->rank() == 0)
        std::printf("RESULT op=load ranks=%d sharded=%d seconds=%.2f wrong_elements=%llu\n", comm->size(),
                    o.sharded ? 1 : 0, s, static_cast<unsigned long long>(bad));
      if (bad != 0) return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "h5ddp-bench-big-tensor: %s\n", e.what());
    return 1;
  }
}

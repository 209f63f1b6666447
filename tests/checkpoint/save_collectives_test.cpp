// Issue 42: what a save asks of MPI does not grow with its tensor count. Counted with the PMPI wrappers of
// tools/bench/mpi_counters.c (linked into this test, symbols exported, so that HDF5's and h5ddp's calls reach
// them): a save of 3,000 tensors (1,000 parameters with Adam's state) must enter no more collectives than a save of
// 30. Parallel HDF5 used to
// re-read each evicted object header with a broadcast when the checksum attribute was added (3,851 collectives
// for 3,000 tensors) until h5::mpio_file_access raised the metadata cache's sync threshold; this catches a return.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../../tools/bench/mpi_counters.h"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp_test/test_util.hpp"

using namespace h5ddp;

namespace {

// Collectives this rank entered during a save of `n` parameters of 16 x 16 float32 with Adam's state (exp_avg,
// exp_avg_sq, step): 4n datasets, 3n tensors, as the checkpoint bench lays them out.
uint64_t collectives_of_save(MpiComm& comm, int n, const std::string& dir) {
  std::vector<std::vector<float>> data(3 * n, std::vector<float>(256, 1.0f));
  std::vector<int64_t> steps(n, 7);
  TrainState s;
  ParamGroup g;
  g.hyper = {{"lr", 1e-3}, {"betas0", 0.9}, {"betas1", 0.999}, {"eps", 1e-8}, {"weight_decay", 0}, {"amsgrad", 0}};
  for (int i = 0; i < n; ++i) {
    const std::string name = "layers." + std::to_string(i) + ".weight";
    s.model.push_back(TensorRef{name, DType::kF32, {16, 16}, data[3 * i].data()});
    s.optimizer.state.push_back(TensorRef{name + "/exp_avg", DType::kF32, {16, 16}, data[3 * i + 1].data()});
    s.optimizer.state.push_back(TensorRef{name + "/exp_avg_sq", DType::kF32, {16, 16}, data[3 * i + 2].data()});
    s.optimizer.state.push_back(TensorRef{name + "/step", DType::kI64, {}, &steps[i]});
    g.params.push_back(name);
  }
  s.optimizer.type = "adam";
  s.optimizer.groups = {g};
  s.counters.step = n;
  s.rng.cpu.assign(16, static_cast<uint8_t>(comm.rank()));
  SaveOptions o;
  o.fsync = false;
  mpi_counters before{}, after{};
  mpi_counters_read(&before);
  save_checkpoint(comm, s, dir, o);
  mpi_counters_read(&after);
  return after.collectives - before.collectives;
}

TEST(SaveCollectives, DoNotGrowWithTheTensorCount) {
  auto& world = test::world();
  const std::string dir = test::scratch_dir("save-collectives");
  const uint64_t few = collectives_of_save(world, 10, dir);
  const uint64_t many = collectives_of_save(world, 1000, dir);
  EXPECT_GT(few, 0u) << "the counters saw no collective: are the wrappers linked and exported?";
  EXPECT_LE(many, few + 2) << "30 tensors: " << few << " collectives, 3,000 tensors: " << many;
}

}  // namespace

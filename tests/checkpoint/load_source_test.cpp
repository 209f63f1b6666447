// Issue 59: a load reads the checkpoint's metadata once per job. Rank 0 opens the file with HDF5 and shares the
// manifest, small datasets and file offsets in one broadcast; the other ranks never open it with HDF5 and read
// the tensors' bytes in a few coalesced reads. Files whose datasets are not contiguous load through HDF5.
#include "checkpoint/load_source.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/direct_read.hpp"
#include "checkpoint/reader.hpp"
#include "h5/h5.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp_test/checkpoint_fixture.hpp"
#include "h5ddp_test/test_util.hpp"

using namespace h5ddp;
using test::OwnedState;
using test::TensorSpec;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// n parameters of 32 floats with Adam's state: 4n datasets.
constexpr int kParams = 1000;
std::vector<TensorSpec> many_params() {
  std::vector<TensorSpec> out;
  for (int i = 0; i < kParams; ++i) out.push_back({"l" + std::to_string(i) + ".weight", DType::kF32, {32}});
  return out;
}
std::vector<TensorSpec> many_adam() {
  std::vector<TensorSpec> out;
  for (int i = 0; i < kParams; ++i) {
    const std::string p = "l" + std::to_string(i) + ".weight/";
    out.push_back({p + "exp_avg", DType::kF32, {32}});
    out.push_back({p + "exp_avg_sq", DType::kF32, {32}});
    out.push_back({p + "step", DType::kI64, {}});
  }
  return out;
}

struct ManyTensors {
  OwnedState s;
  explicit ManyTensors(bool filled) : s(7, test::world().rank(), filled, many_params(), many_adam()) {
    if (!filled) return;
    ParamGroup g;
    g.hyper = {{"lr", 1e-3}, {"betas0", 0.9}, {"betas1", 0.999}, {"eps", 1e-8}, {"weight_decay", 0}, {"amsgrad", 0}};
    for (int i = 0; i < kParams; ++i) g.params.push_back("l" + std::to_string(i) + ".weight");
    s.state.optimizer.groups = {g};
  }
};

std::string save_many(const std::string& name) {
  ManyTensors m(true);
  return save_checkpoint(test::world(), m.s.state, test::scratch_dir(name)).path;
}

struct Counts {
  int opens = 0;
  uint64_t reads = 0;
};

// Loads `path` into a fresh state; returns this rank's HDF5 opens and coalesced read calls, and checks the bytes.
Counts load_counting(const std::string& path, LoadStrategy strategy) {
  ManyTensors want(true), got(false);
  const int opens = ckpt::checkpoint_opens();
  const uint64_t reads = ckpt::coalesced_read_calls();
  LoadOptions lo;
  lo.strategy = strategy;
  lo.direct_io = LoadOptions::DirectIo::kOff;
  load_checkpoint(test::world(), path, got.s.state, lo);
  EXPECT_TRUE(test::differing_tensors(want.s.state, got.s.state).empty());
  EXPECT_EQ(got.s.state.counters.step, want.s.state.counters.step);
  EXPECT_EQ(got.s.state.rng_by_rank.size(), static_cast<size_t>(test::world().size()));
  return Counts{ckpt::checkpoint_opens() - opens, ckpt::coalesced_read_calls() - reads};
}

}  // namespace

// 4,000 datasets: rank 0 opens the file once, no other rank opens it, and each rank's tensor bytes come in a few
// reads (the datasets are adjacent in the file, with metadata between them: one group up to 16 MiB).
TEST(LoadSource, ManyDatasetsInFewReadsAndOneOpenPerJob) {
  const std::string path = save_many("load-source-many");
  for (LoadStrategy strategy : {LoadStrategy::kEveryRankReads, LoadStrategy::kShareExchange}) {
    const Counts c = load_counting(path, strategy);
    std::printf("rank %d strategy %d: %d opens, %llu reads\n", test::world().rank(), static_cast<int>(strategy),
                c.opens, static_cast<unsigned long long>(c.reads));
    EXPECT_EQ(c.opens, test::world().rank() == 0 ? 1 : 0);
    EXPECT_LE(c.reads, 8u) << "rank " << test::world().rank() << ", strategy " << static_cast<int>(strategy);
    if (strategy == LoadStrategy::kEveryRankReads) EXPECT_GE(c.reads, 1u);
  }
  test::world().barrier();
}

// A chunked, compressed copy (h5repack): no offsets to share, so every rank reads it through HDF5 as before.
TEST(LoadSource, ChunkedCopyLoadsThroughHdf5) {
  const std::string path = save_many("load-source-repack");
  const std::string copy = path + ".chunked.h5";
  if (test::world().rank() == 0) {
    const std::string cmd = "h5repack -l CHUNK=8 -f GZIP=1 '" + path + "' '" + copy + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  test::world().barrier();
  const Counts c = load_counting(copy, LoadStrategy::kEveryRankReads);
  EXPECT_EQ(c.opens, test::world().rank() == 0 ? 2 : 1);  // rank 0: the metadata, then the collective read
  EXPECT_EQ(c.reads, 0u);
  test::world().barrier();
}

// Damage in the metadata rank 0 reads (a dataset's dtype attribute) fails the load on every rank, naming the
// file and the dataset; the ranks that never opened the file raise rank 0's error.
TEST(LoadSource, DamagedMetadataFailsEveryRankNamingTheDataset) {
  const std::string path = save_many("load-source-damaged");
  if (test::world().rank() == 0) {
    h5::Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_GE(f.get(), 0);
    h5::Handle ds = h5::dataset(H5Dopen2(f, "/model/l17.weight", H5P_DEFAULT));
    ASSERT_GE(H5Adelete(ds, format::kAttrDtype), 0);
    h5::write_attr(ds, format::kAttrDtype, std::string("float99"));
  }
  test::world().barrier();
  ManyTensors got(false);
  try {
    load_checkpoint(test::world(), path, got.s.state);
    ADD_FAILURE() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "/model/l17.weight")) << e.what();
    EXPECT_TRUE(contains(e.what(), path)) << e.what();
  }
  test::world().barrier();
}

// The wire form round-trips, and a message that ends early or runs long is refused (not read past its end).
TEST(LoadSourceWire, RoundTripsAndRefusesShortOrLongMessages) {
  ckpt::LoadSource s;
  s.manifest.format_version = 1, s.manifest.step = 12, s.manifest.world_size = 3;
  s.manifest.h5ddp_version = "0.9", s.manifest.created = "2026-12-08", s.manifest.optimizer_type = "adam";
  ParamGroup g;
  g.hyper = {{"lr", 0.25}, {"eps", 1e-8}};
  g.params = {"a", "b"};
  s.manifest.param_groups = {g};
  s.manifest.model = {TensorInfo{"a", DType::kBF16, {3, 4}, 0x1234}};
  s.manifest.user = {TensorInfo{"u", DType::kI64, {}, 99}};
  s.manifest.rng_cpu_bytes = 24, s.manifest.tensor_bytes = 32;
  s.small.scheduler.type = "cosine", s.small.scheduler.values = {{"total_steps", 1e6}};
  s.small.meta = {{"model", "gpt"}};
  s.offsets = {{"/model/a", 4096}};
  s.raw = true;
  ckpt::SmallDataset d;
  d.plan.path = "/train/step", d.plan.dtype = DType::kI64, d.plan.checksum = 77, d.bytes = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::string wire = ckpt::encode_load_source(s, {d});
  std::vector<ckpt::SmallDataset> small;
  const ckpt::LoadSource r = ckpt::decode_load_source(wire, "f.h5", &small);
  EXPECT_EQ(r.manifest.step, 12);
  EXPECT_EQ(r.manifest.path, "f.h5");
  EXPECT_EQ(r.manifest.param_groups.at(0).hyper.at("lr"), 0.25);
  EXPECT_EQ(r.manifest.param_groups.at(0).params, g.params);
  EXPECT_EQ(r.manifest.model.at(0).shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(r.manifest.model.at(0).dtype, DType::kBF16);
  EXPECT_EQ(r.manifest.user.at(0).checksum, 99u);
  EXPECT_EQ(r.small.scheduler.values.at("total_steps"), 1e6);
  EXPECT_EQ(r.small.meta.at("model"), "gpt");
  EXPECT_EQ(r.offsets.at("/model/a"), 4096u);
  EXPECT_TRUE(r.raw);
  ASSERT_EQ(small.size(), 1u);
  EXPECT_EQ(small[0].bytes, d.bytes);
  EXPECT_EQ(small[0].plan.checksum, 77u);
  EXPECT_THROW(ckpt::decode_load_source(wire.substr(0, wire.size() - 1), "f.h5", &small), CheckpointError);
  EXPECT_THROW(ckpt::decode_load_source(wire + "x", "f.h5", &small), CheckpointError);
  EXPECT_THROW(ckpt::decode_load_source(std::string(7, '\xff'), "f.h5", &small), CheckpointError);
}

// Issue 39: optimizer state split in row pieces between ranks (element-range sharding, docs/SHARDING.md).
// A sharded save writes each rank's rows into the one dataset: the file holds the bytes a replicated save of the
// same state writes, and its checksums are the replicated file's (chained between the ranks). A load reads each
// rank's rows only, under any split at any rank count, and verifies them together. Pieces that leave rows unowned
// or owned twice are an agreed error before any write (save) or read (load). Runs at 1, 2, 3 and 4 ranks.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "checkpoint/hash.hpp"
#include "checkpoint/pieces.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp_test/checkpoint_fixture.hpp"
#include "h5ddp_test/corrupt_dataset.hpp"
#include "h5ddp_test/test_util.hpp"

namespace fs = std::filesystem;
using namespace h5ddp;
using test::OwnedState;

namespace {

constexpr uint64_t kSeed = 11;
const char* const kSplit[] = {"big.weight/exp_avg", "big.weight/exp_avg_sq"};  // [1000, 300] float32

// Rows [cut(r), cut(r + 1)) of 1000 belong to rank r of n: equal shares, or skewed ones (rank 0 the fewest).
int64_t cut(int r, int n, bool skewed) {
  return skewed ? 1000LL * r * r / (n * n) : 1000LL * r / n;
}

bool is_split(const std::string& name) {
  return name == kSplit[0] || name == kSplit[1];
}

// This rank's share of `full` (a state every rank holds whole): the two big tensors as rows [b, e) pointing into
// full's bytes, conv1's state on rank 0 only, big.weight/step on every rank (as Adam's step of a split parameter).
TrainState shard_of(const TrainState& full, int rank, int n, bool skewed) {
  TrainState s = full;
  s.optimizer.sharded = true;
  s.optimizer.state.clear();
  for (TensorRef t : full.optimizer.state) {
    if (is_split(t.name)) {
      t.row_begin = cut(rank, n, skewed);
      t.row_end = cut(rank + 1, n, skewed);
      t.data = static_cast<char*>(t.data) + t.row_begin * (t.nbytes() / t.rows());
      s.optimizer.state.push_back(t);
    } else if (t.name.rfind("conv1.", 0) == 0 ? rank == 0 : true) {
      s.optimizer.state.push_back(t);
    }
  }
  for (auto& g : s.optimizer.groups) {
    std::vector<std::string> held;
    for (const auto& p : g.params)
      if (p == "big.weight" || rank == 0) held.push_back(p);
    g.params = held;
  }
  return s;
}

// Collective over the world: a communicator of the first n ranks for them, nullptr for the others.
std::unique_ptr<MpiComm> first_ranks(int n) {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(test::world().handle(), test::world().rank() < n ? 0 : MPI_UNDEFINED, test::world().rank(), &sub);
  if (sub == MPI_COMM_NULL) return nullptr;
  auto c = MpiComm::dup(sub);
  MPI_Comm_free(&sub);
  return c;
}

SaveOptions quick(WriteMode mode) {
  SaveOptions o;
  o.fsync = false;
  o.write_mode = mode;
  return o;
}

// The replicated file's tensors and checksums, as one text per dataset.
std::string tensors_of(MpiComm& comm, const std::string& path) {
  std::string out;
  const CheckpointManifest m = read_manifest(comm, path);
  for (const auto* list : {&m.model, &m.optimizer_state})
    for (const auto& t : *list) out += t.name + " " + std::to_string(t.checksum) + "\n";
  return out;
}

class RowPieces : public testing::TestWithParam<WriteMode> {};

// Saved in pieces at every rank count up to the world's: the same tensors and checksums as a replicated save;
// loaded whole (replicated), and in pieces of another split at every rank count: every row comes back.
TEST_P(RowPieces, SaveAsReplicatedAndLoadUnderAnySplit) {
  auto& world = test::world();
  const std::string dir = test::scratch_dir("rowpieces");
  OwnedState full(kSeed, 0);
  if (world.rank() == 0) fs::create_directories(dir + "/rep");
  world.barrier();
  save_checkpoint(world, full.state, dir + "/rep", quick(GetParam()));
  const std::string rep = tensors_of(world, dir + "/rep/ckpt-00000211.h5");
  for (int n = 1; n <= world.size(); ++n) {
    const std::string sub = dir + "/n" + std::to_string(n);
    if (world.rank() == 0) fs::create_directories(sub);
    world.barrier();
    if (auto comm = first_ranks(n)) {
      OwnedState mine(kSeed, comm->rank());
      TrainState shard = shard_of(mine.state, comm->rank(), n, /*skewed=*/n % 2 == 0);
      shard.rng = OwnedState::rng_of(0);  // row r of /rng: the replicated file's rows are all rank 0's
      save_checkpoint(*comm, shard, sub, quick(GetParam()));
    }
    world.barrier();
    const std::string file = sub + "/ckpt-00000211.h5";
    EXPECT_EQ(tensors_of(world, file), rep) << "saved in pieces at " << n << " ranks";
    {  // replicated load: verifies every checksum
      OwnedState back(kSeed, world.rank(), /*filled=*/false);
      load_checkpoint(world, file, back.state);
      EXPECT_EQ(test::differing_tensors(back.state, full.state), std::vector<std::string>{});
    }
    for (int m = 1; m <= world.size(); ++m)
      if (auto comm = first_ranks(m)) {  // another split: skewed where the save's was equal, and back
        OwnedState dest(kSeed, comm->rank(), /*filled=*/false);
        TrainState into = shard_of(dest.state, comm->rank(), m, /*skewed=*/n % 2 == 1);
        load_checkpoint(*comm, file, into);
        for (const TensorRef& t : into.optimizer.state) {
          const TensorRef* want = full.find(t.name);
          ASSERT_NE(want, nullptr);
          const size_t row = want->nbytes() / want->rows();
          const size_t from = t.piece() ? static_cast<size_t>(t.row_begin) * row : 0;
          EXPECT_EQ(std::memcmp(t.data, static_cast<const char*>(want->data) + from, t.held_nbytes()), 0)
              << t.name << " rows [" << t.row_begin << ", " << t.row_end << ") saved at " << n << " loaded at " << m;
        }
      }
    world.barrier();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, RowPieces, testing::Values(WriteMode::kDirect, WriteMode::kMpiio),
                         [](const auto& info) { return info.param == WriteMode::kMpiio ? "mpiio" : "direct"; });

// Rows owned twice or by nobody: one DisagreementError on every rank naming the rows and ranks, and no file.
TEST(RowPiecesBad, OverlapOrGapOnSaveIsAnAgreedErrorAndWritesNothing) {
  auto& world = test::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (const int64_t shift : {-3, 3}) {
    const std::string dir = test::scratch_dir("rowpieces-bad");
    OwnedState mine(kSeed, world.rank());
    TrainState shard = shard_of(mine.state, world.rank(), world.size(), false);
    if (world.rank() == 1)
      for (auto& t : shard.optimizer.state)
        if (t.name == kSplit[0]) t.row_begin += shift, t.data = static_cast<char*>(t.data) + shift * 300 * 4;
    try {
      save_checkpoint(world, shard, dir, quick(WriteMode::kAuto));
      ADD_FAILURE() << "saved pieces that " << (shift < 0 ? "overlap" : "leave a gap");
    } catch (const DisagreementError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(shift < 0 ? "held by ranks 0 and 1" : "held by no rank"), std::string::npos) << what;
      EXPECT_NE(what.find("big.weight/exp_avg"), std::string::npos) << what;
    }
    world.barrier();
    EXPECT_TRUE(fs::is_empty(dir));
  }
}

// The copies of a whole entry that several ranks hold (Adam's step of the split tensor) must agree.
TEST(RowPiecesBad, DifferingCopiesOfAWholeEntryAreAnAgreedError) {
  auto& world = test::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::scratch_dir("rowpieces-copies");
  OwnedState mine(kSeed, world.rank());
  TrainState shard = shard_of(mine.state, world.rank(), world.size(), false);
  int64_t other_step = 0;
  if (world.rank() == 1)
    for (auto& t : shard.optimizer.state)
      if (t.name == "big.weight/step") t.data = &other_step;
  try {
    save_checkpoint(world, shard, dir, quick(WriteMode::kAuto));
    ADD_FAILURE() << "saved differing copies of big.weight/step";
  } catch (const DisagreementError& e) {
    EXPECT_NE(std::string(e.what()).find("/optimizer/state/big.weight/step"), std::string::npos) << e.what();
  }
  world.barrier();
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(RowPiecesBad, OverlapOnLoadIsAMismatchOnEveryRank) {
  auto& world = test::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::scratch_dir("rowpieces-badload");
  OwnedState full(kSeed, 0);
  save_checkpoint(world, full.state, dir, quick(WriteMode::kAuto));
  OwnedState dest(kSeed, world.rank(), false);
  TrainState into = shard_of(dest.state, world.rank(), world.size(), false);
  if (world.rank() == 1)
    for (auto& t : into.optimizer.state)
      if (t.name == kSplit[1]) t.row_begin -= 1, t.data = static_cast<char*>(t.data) - 300 * 4;
  try {
    load_checkpoint(world, dir + "/ckpt-00000211.h5", into);
    ADD_FAILURE() << "loaded overlapping pieces";
  } catch (const CheckpointMismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("big.weight/exp_avg_sq are held by ranks 0 and 1"), std::string::npos)
        << e.what();
  }
}

// A damaged byte in a dataset loaded in pieces fails the load on every rank (the chained checksum).
TEST(RowPiecesBad, CorruptBytesFailAPieceLoad) {
  auto& world = test::world();
  const std::string dir = test::scratch_dir("rowpieces-corrupt");
  OwnedState full(kSeed, 0);
  save_checkpoint(world, full.state, dir, quick(WriteMode::kAuto));
  const std::string file = dir + "/ckpt-00000211.h5";
  test::corrupt_dataset(file, "/optimizer/state/big.weight/exp_avg");
  OwnedState dest(kSeed, world.rank(), false);
  TrainState into = shard_of(dest.state, world.rank(), world.size(), true);
  try {
    load_checkpoint(world, file, into);
    ADD_FAILURE() << "loaded a corrupt file";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch in dataset /optimizer/state/big.weight/exp_avg"),
              std::string::npos)
        << e.what();
  }
}

// The chained hash equals the hash of the whole, whichever way the bytes are cut and wherever the pieces lie.
TEST(RowPiecesHash, ChainedHashEqualsTheWholeHash) {
  auto& world = test::world();
  std::vector<uint8_t> bytes(1 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  const uint64_t whole = ckpt::hash_bytes(bytes.data(), bytes.size());
  const int n = world.size();
  std::vector<ckpt::HashPiece> pieces;
  // Dataset 0: n pieces in rank order, uneven; dataset 1: two pieces per rank, in reverse rank order.
  for (int r = 0; r < n; ++r) {
    const uint64_t b = bytes.size() * r * r / (n * n), e = bytes.size() * (r + 1) * (r + 1) / (n * n);
    pieces.push_back({0, r, b, e, r == world.rank() ? bytes.data() + b : nullptr});
  }
  for (int k = 0; k < 2 * n; ++k) {
    const int r = n - 1 - k / 2;
    const uint64_t b = bytes.size() * k / (2 * n), e = bytes.size() * (k + 1) / (2 * n);
    pieces.push_back({1, r, b, e, r == world.rank() ? bytes.data() + b : nullptr});
  }
  for (const auto& [dataset, hash] : ckpt::chained_hashes(world, pieces)) {
    EXPECT_EQ(hash, whole) << "dataset " << dataset;
    EXPECT_EQ(world.rank(), dataset == 0 ? n - 1 : 0);
  }
}

}  // namespace

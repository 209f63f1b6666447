// The pure parts of the checkpoint plan: byte shares at row granularity, whole-dataset assignment, names.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "checkpoint/errors.hpp"
#include "checkpoint/hash.hpp"
#include "checkpoint/plan.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"

using namespace h5ddp;
using ckpt::DatasetPlan;

namespace {

DatasetPlan ds(std::vector<int64_t> shape, DType t = DType::kF32) {
  DatasetPlan d;
  d.dtype = t;
  d.shape = std::move(shape);
  return d;
}

std::vector<DatasetPlan> mixed() {
  return {ds({1000, 64}),           ds({}), ds({0, 3}), ds({7}, DType::kF64), ds({1, 4096}), ds({3, 5}, DType::kI8),
          ds({250, 3}, DType::kF16)};
}

// What the checkpoint layer hands Comm::rethrow_first: its own error types, tagged once.
TEST(CheckpointErrorPtr, CheckpointTypesTaggedOnce) {
  EXPECT_EQ(ckpt::checkpoint_error(""), nullptr);
  try {
    std::rethrow_exception(ckpt::checkpoint_error("disk on fire"));
  } catch (const CheckpointMismatchError&) {
    ADD_FAILURE() << "not a mismatch";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()), process_tag() + " disk on fire");
  }
  try {  // another rank's error, captured again: it names its rank already
    std::rethrow_exception(ckpt::checkpoint_error("[node7 rank 3/4] other model", /*mismatch=*/true));
  } catch (const CheckpointMismatchError& e) {
    EXPECT_EQ(std::string(e.what()), "[node7 rank 3/4] other model");
  }
  EXPECT_EQ(ckpt::checkpoint_error_of([] {}), nullptr);
  try {
    std::rethrow_exception(ckpt::checkpoint_error_of([] { throw H5Error("H5Dwrite failed"); }));
  } catch (const CheckpointError& e) {  // any error of a phase becomes the checkpoint layer's error
    EXPECT_EQ(std::string(e.what()), process_tag() + " H5Dwrite failed");
  }
}

TEST(Segments, CoverEveryRowExactlyOnceInRankOrder) {
  const auto plan = mixed();
  for (int world : {1, 2, 3, 4, 7, 64}) {
    const auto segs = ckpt::compute_segments(plan, world);
    std::map<size_t, uint64_t> next_row;
    int last_rank = 0;
    std::vector<uint64_t> bytes(world, 0);
    for (const auto& s : segs) {
      EXPECT_LT(s.row_begin, s.row_end);
      EXPECT_EQ(s.row_begin, next_row[s.index]) << "rows must be contiguous, world " << world;
      next_row[s.index] = s.row_end;
      EXPECT_GE(s.rank, last_rank) << "shares are contiguous in dataset order";
      last_rank = s.rank;
      bytes[s.rank] += (s.row_end - s.row_begin) * plan[s.index].row_bytes();
    }
    uint64_t total = 0, max_row = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      total += plan[i].nbytes();
      max_row = std::max<uint64_t>(max_row, plan[i].row_bytes());
      if (plan[i].nbytes() > 0) {
        EXPECT_EQ(next_row[i], plan[i].rows()) << i;
      }
    }
    for (int r = 0; r < world; ++r)  // balanced up to one row at each end of a share
      EXPECT_LE(bytes[r], total / world + 2 * max_row) << "rank " << r << " of " << world;
  }
}

TEST(Segments, OneLargeTensorIsSplitAmongAllRanks) {
  const auto segs = ckpt::compute_segments({ds({1024, 256})}, 4);
  ASSERT_EQ(segs.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(segs[r].rank, r);
    EXPECT_EQ(segs[r].row_end - segs[r].row_begin, 256u);
  }
}

TEST(Segments, ScalarsAndEmptyTensors) {
  const auto segs = ckpt::compute_segments({ds({}), ds({0}), ds({}, DType::kI64)}, 3);
  ASSERT_EQ(segs.size(), 2u);  // the empty tensor has no rows to write
  EXPECT_EQ(segs[0].index, 0u);
  EXPECT_EQ(segs[1].index, 2u);
}

TEST(WholeDatasets, BalanceBytes) {
  std::vector<DatasetPlan> plan = {ds({100}), ds({100}), ds({50}), ds({50}), ds({1})};
  auto owner = ckpt::assign_whole_datasets(plan, 2);
  uint64_t load[2] = {0, 0};
  for (size_t i = 0; i < plan.size(); ++i) load[owner[i]] += plan[i].nbytes();
  EXPECT_LE(std::max(load[0], load[1]) - std::min(load[0], load[1]), 4u);
}

TEST(SampleHash, SeesSampledBytesAndSizeButNotTheGaps) {
  std::vector<uint8_t> a(1 << 20);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint64_t h = ckpt::sample_hash(a.data(), a.size());
  EXPECT_EQ(h, ckpt::sample_hash(a.data(), a.size()));
  EXPECT_NE(h, ckpt::sample_hash(a.data(), a.size() - 1));                         // the size is part of it
  for (size_t at : {size_t{0}, a.size() - 1, (a.size() - 4096) / 15 * 7 + 100}) {  // first, last, block 7
    auto b = a;
    b[at] ^= 1;
    EXPECT_NE(h, ckpt::sample_hash(b.data(), b.size())) << "flip at " << at;
  }
  auto gap = a;
  gap[10000] ^= 1;  // between block 0 ([0, 4096)) and block 1: not sampled, by design
  EXPECT_EQ(h, ckpt::sample_hash(gap.data(), gap.size()));
  std::vector<uint8_t> small(100, 3);  // up to 64 KiB: every byte counts
  const uint64_t hs = ckpt::sample_hash(small.data(), small.size());
  small[50] = 4;
  EXPECT_NE(hs, ckpt::sample_hash(small.data(), small.size()));
}

TEST(BackgroundHasher, MatchesHashBytesForEverySubmittedSlot) {
  std::vector<std::vector<uint8_t>> bufs;
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{1} << 20}) bufs.emplace_back(n, static_cast<uint8_t>(n));
  ckpt::BackgroundHasher hasher(bufs.size() + 1);
  for (size_t i = 0; i < bufs.size(); ++i) hasher.submit(i, bufs[i].data(), bufs[i].size());
  const auto got = hasher.finish();
  ASSERT_EQ(got.size(), bufs.size() + 1);
  for (size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(got[i], ckpt::hash_bytes(bufs[i].data(), bufs[i].size())) << i;
  EXPECT_EQ(got.back(), 0u);  // never submitted
}

TEST(StreamHash, EqualsHashBytesOfTheConcatenationWhateverThePieces) {
  std::vector<uint8_t> a((1 << 20) + 37);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint64_t whole = ckpt::hash_bytes(a.data(), a.size());
  for (size_t piece : {size_t{1} << 20, size_t{4096}, size_t{1000}, size_t{7}}) {
    ckpt::StreamHash h;
    for (size_t off = 0; off < a.size(); off += piece) h.update(a.data() + off, std::min(piece, a.size() - off));
    EXPECT_EQ(h.digest(), whole) << "pieces of " << piece;
  }
  ckpt::StreamHash missing_last;
  missing_last.update(a.data(), a.size() - 1);
  EXPECT_NE(missing_last.digest(), whole);
  ckpt::StreamHash empty;
  EXPECT_EQ(empty.digest(), ckpt::hash_bytes(nullptr, 0));
}

// Known answers from Debian's libxxhash.so (XXH3_64bits, an independent build) on bytes (i * 2654435761) >> 13:
// every kernel this CPU runs, one-shot and streamed, at every alignment, must give the file format's values.
TEST(HashKernels, EveryKernelGivesTheKnownXxh3Values) {
  const std::vector<std::pair<size_t, uint64_t>> known = {
      {0, 0x2d06800538d394c2ull},      {1, 0xc44bdff4074eecdbull},    {3, 0xa1c4a8259b827291ull},
      {17, 0x47aad6b375eb4bbaull},     {129, 0x9e2414800f83768aull},  {240, 0xb714c5fd22744964ull},
      {241, 0xbc424a2c480dd281ull},    {1024, 0x1fd15e7d36f5e1bcull}, {100003, 0x25ba638a3c66d20full},
      {1048583, 0xa80bea05304486e6ull}};
  const auto kernels = ckpt::hash_kernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels.front(), "default");
  EXPECT_NE(std::find(kernels.begin(), kernels.end(), ckpt::hash_kernel()), kernels.end());
  EXPECT_THROW(ckpt::hash_bytes_with("no-such-kernel", nullptr, 0), Error);
  for (size_t align = 0; align < 4; ++align) {
    std::vector<uint8_t> buf(align + (1 << 20) + 7);
    for (const auto& [n, want] : known) {
      uint8_t* a = buf.data() + align;
      for (size_t i = 0; i < n; ++i) a[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
      EXPECT_EQ(ckpt::hash_bytes(a, n), want) << n << " bytes at offset " << align;
      for (const auto& k : kernels) {
        EXPECT_EQ(ckpt::hash_bytes_with(k, a, n), want) << k << ", " << n << " bytes at offset " << align;
        ckpt::StreamHash h(k);
        for (size_t off = 0, piece = 1; off < n; off += piece, piece = piece * 3 + 1)
          h.update(a + off, std::min(piece, n - off));
        EXPECT_EQ(h.digest(), want) << k << " streamed, " << n << " bytes at offset " << align;
      }
    }
  }
}

TEST(Format, NamesAndSteps) {
  EXPECT_EQ(format::model_dataset("features.0.weight"), "/model/features.0.weight");
  EXPECT_THROW(format::model_dataset("module.fc.weight"), CheckpointError);
  EXPECT_THROW(format::model_dataset("a/b"), CheckpointError);
  EXPECT_EQ(format::optimizer_state_dataset("fc.weight/exp_avg"), "/optimizer/state/fc.weight/exp_avg");
  EXPECT_EQ(format::optimizer_state_entry("/optimizer/state/fc.weight/exp_avg"), "fc.weight/exp_avg");
  EXPECT_THROW(format::optimizer_state_dataset("exp_avg"), CheckpointError);
  EXPECT_EQ(format::checkpoint_file_name(200), "ckpt-00000200.h5");
  EXPECT_EQ(format::checkpoint_step_from_name("ckpt-00000200.h5"), 200);
  EXPECT_EQ(format::checkpoint_step_from_name("ckpt-00000200.h5.partial"), -1);
  EXPECT_EQ(format::checkpoint_step_from_name("ckpt-.h5"), -1);
  EXPECT_EQ(format::checkpoint_step_from_name("latest"), -1);
}

}  // namespace

// write_extents_direct: every byte of every extent lands at its offset and nothing else in the file changes,
// whatever the alignment of memory, offset and length (aligned blocks straight from memory, misaligned memory
// through a bounce buffer, partial blocks at the edges through the page cache, two extents sharing a block);
// progress() counts up to the total; a file system that refuses O_DIRECT gets the same bytes through the page
// cache; a failed write names the file, the extent and the offset. Checkpoint-level saves with each write mode
// are compared in checkpoint_test.
#include "checkpoint/direct_write.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "h5ddp/error.hpp"
#include "h5ddp_test/test_util.hpp"

using namespace h5ddp;
using ckpt::WriteExtent;

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : p(static_cast<char*>(std::aligned_alloc(4096, (n + 8192) / 4096 * 4096))) {}
  ~AlignedBuf() { std::free(p); }
  char* p;
};

constexpr size_t kMiB = 1u << 20;

// Aligned memory and offset over several pieces with an odd tail; memory aligned unlike the offset (bounce);
// an extent below kDirectWriteMinBytes (page cache whole); two extents sharing the block at 34 MiB + 100; a tail
// block that is partial.
std::vector<WriteExtent> mixed_extents(const AlignedBuf& mem) {
  return {{1 * kMiB, 20 * kMiB + 123, mem.p, "aligned+tail"},
          {22 * kMiB + 5, 9 * kMiB + 7, mem.p + 24 * kMiB + 1, "misaligned memory"},
          {32 * kMiB, 4096 * 10, mem.p + 34 * kMiB, "small"},
          {33 * kMiB, kMiB + 100, mem.p + 35 * kMiB, "shares a block (left)"},
          {34 * kMiB + 100, kMiB, mem.p + 37 * kMiB + 100, "shares a block (right)"}};
}

// Writes `extents` over a file of other bytes; checks the file is those bytes with exactly the extents replaced
// and that progress counted up to the total.
ckpt::DirectWriteResult write_and_check(const std::string& dir, const std::vector<WriteExtent>& extents,
                                        ckpt::RefuseDirect refuse = ckpt::RefuseDirect::kNo) {
  auto expected = test::pattern_bytes(36 * kMiB, 1234567);
  const std::string path = test::write_bytes(dir, "extents.bin", expected);
  uint64_t total = 0, last = 0;
  for (const auto& x : extents) {
    std::memcpy(expected.data() + x.offset, x.src, x.n);
    total += x.n;
  }
  const auto r = ckpt::write_extents_direct(
      path, extents,
      [&](uint64_t done) {
        EXPECT_GT(done, last) << "progress went backwards";
        last = done;
      },
      refuse);
  EXPECT_EQ(last, total);
  EXPECT_EQ(r.direct_bytes + r.buffered_bytes, total);
  const auto got = read_file(path);
  EXPECT_EQ(got.size(), expected.size());
  for (const auto& x : extents)
    EXPECT_EQ(std::memcmp(got.data() + x.offset, x.src, x.n), 0) << x.what << ": wrong bytes in the file";
  EXPECT_TRUE(got == expected) << "bytes outside the extents changed";
  return r;
}

TEST(DirectWrite, EveryAlignmentWritesTheRightBytesAndNothingElse) {
  AlignedBuf mem(40 * kMiB);
  const auto src = test::pattern_bytes(40 * kMiB, 99);
  std::memcpy(mem.p, src.data(), src.size());
  const auto r = write_and_check(test::scratch_dir("direct_write"), mixed_extents(mem));
  // /tmp (the scratch dir) is a disk file system where the tests run: O_DIRECT must have been used, through
  // the bounce buffer too, or this test would not test those paths.
  EXPECT_GE(r.direct_bytes, 28 * kMiB) << "O_DIRECT was not used";
  EXPECT_GE(r.bounced_bytes, 8 * kMiB) << "the misaligned extent did not go through a bounce buffer";
  EXPECT_GT(r.buffered_bytes, 4096u * 10) << "edges and the small extent must go through the page cache";
}

// Where the file system refuses O_DIRECT (at open, or with EINVAL at the first write: older tmpfs, some FUSE
// file systems), the same bytes go through the page cache.
TEST(DirectWrite, RefusedDirectIoFallsBackToThePageCache) {
  AlignedBuf mem(40 * kMiB);
  const auto src = test::pattern_bytes(40 * kMiB, 7);
  std::memcpy(mem.p, src.data(), src.size());
  for (auto refuse : {ckpt::RefuseDirect::kAtOpen, ckpt::RefuseDirect::kAtFirstRead}) {
    const auto r = write_and_check(test::scratch_dir("direct_write_refused"), mixed_extents(mem), refuse);
    EXPECT_EQ(r.direct_bytes, 0u) << "refused at " << static_cast<int>(refuse);
  }
}

// /dev/full fails every write with ENOSPC (and refuses O_DIRECT): the error names the file, the extent and the
// offset, as a full disk would.
TEST(DirectWrite, FailedWriteNamesFileExtentAndOffset) {
  AlignedBuf mem(2 * kMiB);
  const std::vector<WriteExtent> extents = {{3 * kMiB, kMiB, mem.p, "/model/full.weight rows [0, 8)"}};
  try {
    ckpt::write_extents_direct("/dev/full", extents, nullptr);
    ADD_FAILURE() << "no error for writes to /dev/full";
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/dev/full"), std::string::npos) << m;
    EXPECT_NE(m.find("/model/full.weight rows [0, 8)"), std::string::npos) << m;
    EXPECT_NE(m.find("at file offset " + std::to_string(3 * kMiB)), std::string::npos) << m;
    EXPECT_NE(m.find(std::strerror(ENOSPC)), std::string::npos) << m;
  }
  EXPECT_THROW(ckpt::write_extents_direct("/nonexistent-dir/x.h5.partial", extents, nullptr), CheckpointError);
}

}  // namespace

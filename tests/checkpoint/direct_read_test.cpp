// read_extents_direct: bytes land where they should whatever the alignment of memory, offset and length,
// consume() sees every extent's bytes in order, a file that ends early is an error naming the file and the
// extent, and a file system that refuses O_DIRECT gets the same bytes through the page cache. Checkpoint-level
// loads with direct reads on and off are compared in checkpoint_test.
#include "checkpoint/direct_read.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "h5ddp/error.hpp"
#include "h5ddp_test/test_util.hpp"

namespace fs = std::filesystem;
using namespace h5ddp;
using ckpt::FileExtent;

namespace {

constexpr uint64_t kSeed = 88172645463325252ull;

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : p(static_cast<char*>(std::aligned_alloc(4096, (n + 8192) / 4096 * 4096))) {}
  ~AlignedBuf() { std::free(p); }
  char* p;
};

// Reads `extents` of `path` and checks every byte against `file`, and that consume() saw each extent's bytes
// exactly once, in order. Returns read_extents_direct's answer (O_DIRECT used).
bool read_and_check(const std::string& path, std::vector<FileExtent> extents, const std::vector<char>& file,
                    ckpt::RefuseDirect refuse = ckpt::RefuseDirect::kNo) {
  std::vector<uint64_t> seen(extents.size(), 0);
  size_t last = 0;
  const bool direct = ckpt::read_extents_direct(
      path, extents,
      [&](size_t e, const char* data, size_t n) {
        EXPECT_GE(e, last) << "extents out of order";
        last = e;
        EXPECT_EQ(data, extents[e].dst + seen[e]) << "pieces of extent " << e << " out of order";
        seen[e] += n;
      },
      refuse);
  for (size_t e = 0; e < extents.size(); ++e) {
    EXPECT_EQ(seen[e], extents[e].n) << extents[e].what;
    EXPECT_EQ(std::memcmp(extents[e].dst, file.data() + extents[e].offset, extents[e].n), 0) << extents[e].what;
  }
  return direct;
}

std::vector<FileExtent> mixed_extents(AlignedBuf& mem) {
  // Aligned and several pieces long with an odd tail; unaligned everything; exactly one block; an extent
  // whose memory is aligned but whose file offset is not.
  return {{1u << 20, (20u << 20) + 123, mem.p, "aligned+tail"},
          {4096 * 3 + 5, (9u << 20) + 7, mem.p + (24u << 20) + 1, "unaligned"},
          {4096 * 40, 4096, mem.p + (36u << 20), "one block"},
          {77, 5000, mem.p + (37u << 20), "offset 77"}};
}

TEST(DirectRead, EveryAlignmentLandsTheRightBytes) {
  const auto file = test::pattern_bytes((30u << 20) + 999, kSeed);
  const std::string path = test::write_bytes(test::scratch_dir("direct_read"), "extents.bin", file);
  AlignedBuf mem(40u << 20);
  const bool direct = read_and_check(path, mixed_extents(mem), file);
  // /tmp (the scratch dir) is a disk file system on the machines the tests run on: O_DIRECT must have been used,
  // or this test would not be testing the aligned and bounce paths at all.
  EXPECT_TRUE(direct) << "O_DIRECT was not used under " << path;
}

// Where the file system refuses O_DIRECT (at open, or with EINVAL at the first read: older tmpfs, some FUSE
// file systems), the same reads go through the page cache.
TEST(DirectRead, RefusedDirectIoFallsBackToThePageCache) {
  const auto file = test::pattern_bytes((30u << 20) + 999, kSeed);
  const std::string path = test::write_bytes(test::scratch_dir("direct_read_refused"), "extents.bin", file);
  for (auto refuse : {ckpt::RefuseDirect::kAtOpen, ckpt::RefuseDirect::kAtFirstRead}) {
    AlignedBuf mem(40u << 20);
    EXPECT_FALSE(read_and_check(path, mixed_extents(mem), file, refuse)) << "refused at " << static_cast<int>(refuse);
  }
}

TEST(DirectRead, FileEndingInsideAnExtentNamesFileExtentAndOffset) {
  const auto file = test::pattern_bytes((3u << 20) + 100, kSeed);
  const std::string path = test::write_bytes(test::scratch_dir("direct_read_short"), "extents.bin", file);
  AlignedBuf mem(8u << 20);
  for (uint64_t offset : {uint64_t{1} << 20, uint64_t{1000}}) {  // aligned (direct) and unaligned (bounce)
    std::vector<FileExtent> extents = {{offset, 4u << 20, mem.p, "/model/cut.weight"}};
    try {
      ckpt::read_extents_direct(path, extents, [](size_t, const char*, size_t) {});
      ADD_FAILURE() << "no error for a file that ends inside the extent";
    } catch (const CheckpointError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find("/model/cut.weight"), std::string::npos) << m;
      EXPECT_NE(m.find("ends at byte " + std::to_string(file.size())), std::string::npos) << m;
    }
  }
}

}  // namespace

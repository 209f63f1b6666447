// MpiEnv keeps glibc's heap (src/core/mpi_env.cpp): a mid-sized block comes from the heap, not from a fresh
// mmap, and freeing it leaves the heap as large as it was (no trim), so the next step's activations reuse
// pages already faulted in. With H5DDP_MALLOC_TUNE=0 the same checks must see glibc's defaults (run
// `H5DDP_MALLOC_TUNE=0 comm_test --gtest_filter='MallocTune*'`: the block is mmapped).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace {

#ifdef __GLIBC__
TEST(MallocTune, MidSizedBlocksComeFromTheHeapAndStayAfterFree) {
  for (const char* v : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX"})
    if (std::getenv(v)) GTEST_SKIP() << v << " is set: MpiEnv leaves malloc to the user";
  const char* tune = std::getenv("H5DDP_MALLOC_TUNE");
  const bool tuned = !(tune && std::string(tune) == "0");
  constexpr size_t kBlock = size_t{16} << 20;  // below the tuned mmap threshold (32 MiB), far above glibc's 128 KiB
  const struct mallinfo2 before = mallinfo2();
  void* volatile p = std::malloc(kBlock);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kBlock);
  const struct mallinfo2 during = mallinfo2();
  std::free(p);
  const struct mallinfo2 after = mallinfo2();
  if (tuned) {
    EXPECT_EQ(during.hblkhd, before.hblkhd) << "a 16 MiB block was served by mmap";
    EXPECT_GE(after.arena, during.arena) << "the heap was trimmed after a free";
    EXPECT_GE(after.fordblks, kBlock) << "the freed block is not kept in the heap";
  } else {
    EXPECT_GE(during.hblkhd, before.hblkhd + kBlock) << "with H5DDP_MALLOC_TUNE=0 a 16 MiB block should be mmapped";
  }
}
#endif

}  // namespace

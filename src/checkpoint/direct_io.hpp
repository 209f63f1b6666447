// Private to h5ddp_checkpoint: what the O_DIRECT reader (direct_read.cpp) and writer (direct_write.cpp) share.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace h5ddp::ckpt::direct_io {

// O_DIRECT alignment of memory, file offset and length (a multiple of the 512 most devices need).
inline constexpr uint64_t kBlock = 4096;

inline bool aligned(uint64_t v) {
  return v % kBlock == 0;
}
inline uint64_t round_down(uint64_t v) {
  return v / kBlock * kBlock;
}
inline uint64_t round_up(uint64_t v) {
  return (v + kBlock - 1) / kBlock * kBlock;
}

// A file descriptor closed with its owner (-1: none).
struct Fd {
  int fd = -1;
  Fd() = default;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct AlignedFree {
  void operator()(char* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, AlignedFree>;

// n bytes at a kBlock boundary; null when the memory is not there.
inline AlignedBuffer aligned_buffer(size_t n) {
  void* m = nullptr;
  if (::posix_memalign(&m, kBlock, n) != 0) return nullptr;
  return AlignedBuffer(static_cast<char*>(m));
}

}  // namespace h5ddp::ckpt::direct_io

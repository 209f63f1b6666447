// Private to h5ddp_io: reads byte ranges of one file with O_DIRECT, several reads in flight, handing the
// bytes to the caller in file order so that it can hash them while the next reads are on their way.
// Why and when (measurements): docs/DESIGN.md, "Loads read around the page cache".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace h5ddp::ckpt {

// One contiguous range of the file and where its bytes go.
struct FileExtent {
  uint64_t offset = 0;  // in the file
  uint64_t n = 0;
  char* dst = nullptr;
  std::string what;  // names the range in errors (the dataset's path)
};

// Pieces larger than this are split; each piece is one pread (the kernel splits it further for the device).
inline constexpr size_t kDirectPieceBytes = 8u << 20;
// Reads in flight at once; also the number of reader threads.
inline constexpr int kDirectReadsInFlight = 4;

// Reads every extent of `path` into its dst. consume(extent index, data, n) is called on the calling thread for
// each extent's bytes in order, once they are in dst (data points into dst), extents in the order given: the
// caller hashes there while the readers fetch the next pieces. A piece whose memory, file offset and length
// are all multiples of 4096 is read straight into dst; any other goes through an aligned bounce buffer
// (kDirectReadsInFlight + 1 of kDirectPieceBytes + 8 KiB) and is copied. Where the file system refuses
// O_DIRECT (open or the first read fails with EINVAL, e.g. tmpfs), the same reads go through the page cache.
// Throws CheckpointError naming `path`, the extent and the offset for a read error or a file that ends early.
// Returns whether O_DIRECT was used. `refuse` (tests) makes it behave as a file system that refuses O_DIRECT.
enum class RefuseDirect { kNo, kAtOpen, kAtFirstRead };
bool read_extents_direct(const std::string& path, const std::vector<FileExtent>& extents,
                         const std::function<void(size_t extent, const char* data, size_t n)>& consume,
                         RefuseDirect refuse = RefuseDirect::kNo);

}  // namespace h5ddp::ckpt

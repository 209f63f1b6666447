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

// Coalesced reads through the page cache (the loads' path once rank 0 has shared the file offsets). Extents are
// read in file order; an extent joins the group before it when it starts at most kMergeGapBytes after the
// group's end (the gap holds HDF5 metadata or alignment padding, read and dropped) and the group then spans at
// most `piece` bytes: each group is one pread into a reused buffer of `piece` bytes (the memory bound), copied to
// the extents' dst. An extent larger than `piece` is read alone, in pieces of `piece` bytes, straight into dst
// unless `bounce` (then through the buffer: see loader.cpp bounce_reads). Extents that overlap are never merged.
// consume(extent, data, n) is called for each extent's bytes in order once they are in dst (data points into
// dst), one extent after the other in file order. Throws CheckpointError naming `path`, the extent and the offset
// for a read error or a file that ends early. Returns the number of read calls made (the preads, EINTR retries
// and short reads included).
inline constexpr uint64_t kMergeGapBytes = 256u << 10;
size_t read_extents_coalesced(const std::string& path, const std::vector<FileExtent>& extents, size_t piece,
                              bool bounce,
                              const std::function<void(size_t extent, const char* data, size_t n)>& consume);
// Test-only: read calls read_extents_coalesced has made in this process so far.
uint64_t coalesced_read_calls();

}  // namespace h5ddp::ckpt

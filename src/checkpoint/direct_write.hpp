// Private to h5ddp_checkpoint: writes byte ranges of one file around the page cache (O_DIRECT), several
// writes in flight. Why: on these VMs every new page-cache page costs CPU time (about 1-2 s of system time per
// GiB, measured with dd: docs/DESIGN.md, "Writes around the page cache"), which a background save takes from
// training; an O_DIRECT write hands the caller's pages to the device and allocates none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/direct_read.hpp"  // RefuseDirect

namespace h5ddp::ckpt {

// One contiguous range of the file and where its bytes come from.
struct WriteExtent {
  uint64_t offset = 0;  // in the file
  uint64_t n = 0;
  const char* src = nullptr;
  std::string what;  // names the range in errors (the dataset's path and rows)
};

struct DirectWriteResult {
  uint64_t direct_bytes = 0;    // written with O_DIRECT (straight from the source or through a bounce buffer)
  uint64_t bounced_bytes = 0;   // part of direct_bytes copied into an aligned buffer first (source misaligned)
  uint64_t buffered_bytes = 0;  // written through the page cache (edges, small extents, refused O_DIRECT)
};

// Extents smaller than this are written through the page cache whole (a bounce or the device's latency per
// request would cost more than the pages).
inline constexpr uint64_t kDirectWriteMinBytes = 256u << 10;

// Writes every extent of `path` (which must exist; extents must not overlap). Each extent's whole 4 KiB blocks
// go with O_DIRECT, straight from `src` where its address is aligned like the file offset, else through one of
// the writers' aligned bounce buffers; the partial blocks at its edges (which other datasets or HDF5 metadata
// share) go through the page cache. Where the file system refuses O_DIRECT (open or a first write fails with
// EINVAL), everything goes through the page cache. Durability is the caller's: fsync after (O_DIRECT does not
// flush the device's cache). progress(bytes) is called on the calling thread as the extents complete, in order,
// with the bytes done so far. `refuse` (tests) makes it behave as a file system that refuses O_DIRECT at open
// (kAtOpen) or at the first write (kAtFirstRead). Throws CheckpointError naming `path`, the extent and the offset.
DirectWriteResult write_extents_direct(const std::string& path, const std::vector<WriteExtent>& extents,
                                       const std::function<void(uint64_t done)>& progress,
                                       RefuseDirect refuse = RefuseDirect::kNo);

// Test-only (armed like maybe_inject_fault): H5DDP_FAULT_INJECT=refuse_direct_open:<who> or
// refuse_direct_write:<who> makes save_checkpoint's direct writes on those ranks meet a file system that refuses
// O_DIRECT at open or at the first write. kNo otherwise.
RefuseDirect refuse_direct_for_tests(int rank);

}  // namespace h5ddp::ckpt

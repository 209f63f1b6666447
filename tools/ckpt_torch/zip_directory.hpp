// The central directory of a zip archive (with ZIP64), read and checked without LibTorch, so that
// h5ddp-ckpt import knows every record's size before LibTorch's reader (miniz) allocates it, and so the
// fuzzer (tests/fuzz/) can reach it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace h5ddp::interop {

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 stored (what torch.save writes), 8 deflated
  uint64_t compressed_size = 0;
  uint64_t size = 0;           // uncompressed
  uint64_t header_offset = 0;  // of the local file header
};

class ZipDirectory {
 public:
  // Fills `buffer` with `n` bytes at `offset`, or throws.
  using ReadAt = std::function<void(uint64_t offset, char* buffer, size_t n)>;

  // Local. Reads the directory of a `file_size`-byte archive. Throws CheckpointError naming `file` when the
  // archive is truncated or damaged: no end-of-directory record, a directory outside the file, a record
  // whose data would reach past the end of the file, a stored record whose two sizes differ, a deflated
  // one declaring more than deflate can expand to, another compression method, two records of one name.
  static ZipDirectory read(const std::string& file, uint64_t file_size, const ReadAt& read_at);

  // The record named `name` (compared ignoring case, as miniz does), or nullptr.
  const ZipEntry* find(const std::string& name) const;
  const std::vector<ZipEntry>& entries() const { return entries_; }

 private:
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> by_name_;  // lower-case name -> index
};

}  // namespace h5ddp::interop

#include "zip_directory.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "h5ddp/error.hpp"
#include "pickle.hpp"

namespace h5ddp::interop {
namespace {

constexpr uint32_t kEndSignature = 0x06054b50;    // end of central directory record
constexpr uint32_t kEnd64Locator = 0x07064b50;    // ZIP64 end of central directory locator
constexpr uint32_t kEnd64Signature = 0x06064b50;  // ZIP64 end of central directory record
constexpr uint32_t kEntrySignature = 0x02014b50;  // central directory file header
constexpr size_t kEndSize = 22, kLocatorSize = 20, kEnd64Size = 56, kEntrySize = 46, kLocalHeaderSize = 30;
constexpr size_t kMaxComment = 0xffff;
// The most deflate can expand: 258 bytes out of a 2-bit code (RFC 1951), i.e. under 1032:1.
constexpr uint64_t kMaxDeflateRatio = 1032;
// A directory is ~50 bytes plus the name per record; torch.save writes one record per storage.
constexpr uint64_t kMaxDirectoryBytes = uint64_t{256} << 20;

uint16_t u16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | static_cast<uint8_t>(p[1]) << 8);
}
uint32_t u32(const char* p) {
  return u16(p) | static_cast<uint32_t>(u16(p + 2)) << 16;
}
uint64_t u64(const char* p) {
  return u32(p) | static_cast<uint64_t>(u32(p + 4)) << 32;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

ZipDirectory ZipDirectory::read(const std::string& file, uint64_t file_size, const ReadAt& read_at) {
  auto damaged = [&](const std::string& what) -> CheckpointError {
    return CheckpointError(file + ": damaged or truncated zip archive (" + what + ")");
  };
  // The end record is in the last 22 + 65535 (comment) bytes; the one nearest the end wins, as in miniz.
  if (file_size < kEndSize) throw damaged("shorter than an end-of-directory record");
  const uint64_t tail_size = std::min<uint64_t>(file_size, kEndSize + kMaxComment);
  std::vector<char> tail(tail_size);
  read_at(file_size - tail_size, tail.data(), tail.size());
  size_t end_at = tail_size;  // in `tail`
  for (size_t i = tail_size - kEndSize + 1; i-- > 0;)
    if (u32(&tail[i]) == kEndSignature) {
      end_at = i;
      break;
    }
  if (end_at == tail_size) throw damaged("no end-of-directory record; the file may be cut short");
  const char* end = &tail[end_at];
  const uint64_t end_offset = file_size - tail_size + end_at;
  if (u16(end + 4) != 0 || u16(end + 6) != 0) throw damaged("spans several disks");
  uint64_t count = u16(end + 10), dir_size = u32(end + 12), dir_offset = u32(end + 16);

  // ZIP64: a locator just before the end record points to the 64-bit end record.
  if (end_offset >= kLocatorSize) {
    char loc[kLocatorSize];
    read_at(end_offset - kLocatorSize, loc, sizeof loc);
    if (u32(loc) == kEnd64Locator) {
      const uint64_t end64_offset = u64(loc + 8);
      if (end64_offset > end_offset - kLocatorSize || end_offset - kLocatorSize - end64_offset < kEnd64Size)
        throw damaged("ZIP64 end record outside the file");
      char e64[kEnd64Size];
      read_at(end64_offset, e64, sizeof e64);
      if (u32(e64) != kEnd64Signature) throw damaged("no ZIP64 end record where its locator points");
      count = u64(e64 + 32);
      dir_size = u64(e64 + 40);
      dir_offset = u64(e64 + 48);
    }
  }
  if (dir_offset > end_offset || dir_size > end_offset - dir_offset)
    throw damaged("central directory outside the file; the file may be cut short");
  if (dir_size > kMaxDirectoryBytes)
    throw damaged("central directory of " + std::to_string(dir_size) + " bytes, more than h5ddp reads");
  if (count > dir_size / kEntrySize) throw damaged(std::to_string(count) + " records declared in a smaller directory");

  std::vector<char> dir(static_cast<size_t>(dir_size));
  if (!dir.empty()) read_at(dir_offset, dir.data(), dir.size());  // an empty vector's data() may be null
  ZipDirectory out;
  out.entries_.reserve(static_cast<size_t>(count));
  size_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (dir.size() - at < kEntrySize || u32(&dir[at]) != kEntrySignature)
      throw damaged("central directory record " + std::to_string(i) + " is damaged");
    const char* h = &dir[at];
    ZipEntry e;
    e.method = u16(h + 10);
    e.compressed_size = u32(h + 20);
    e.size = u32(h + 24);
    const size_t name_len = u16(h + 28), extra_len = u16(h + 30), comment_len = u16(h + 32);
    e.header_offset = u32(h + 42);
    if (dir.size() - at - kEntrySize < name_len + extra_len + comment_len)
      throw damaged("central directory record " + std::to_string(i) + " runs past the directory");
    e.name.assign(h + kEntrySize, name_len);
    // ZIP64 extended information (id 1): the 64-bit values of the fields that hold 0xffffffff, in order.
    const char* x = h + kEntrySize + name_len;
    const char* x_end = x + extra_len;
    while (x_end - x >= 4) {
      const uint16_t id = u16(x), len = u16(x + 2);
      const char* field = x + 4;
      if (static_cast<size_t>(x_end - field) < len)
        throw damaged("extra field of '" + printable(e.name) + "' runs past its record");
      if (id == 1) {
        const char* f = field;
        for (uint64_t* v : {&e.size, &e.compressed_size, &e.header_offset}) {
          if (*v != 0xffffffffu) continue;
          if (field + len - f < 8) throw damaged("ZIP64 field of '" + printable(e.name) + "' is too short");
          *v = u64(f);
          f += 8;
        }
      }
      x = field + len;
    }
    at += kEntrySize + name_len + extra_len + comment_len;

    const std::string what = "record '" + printable(e.name) + "'";
    if (e.header_offset > dir_offset || dir_offset - e.header_offset < kLocalHeaderSize ||
        e.compressed_size > file_size - e.header_offset - kLocalHeaderSize)
      throw damaged(what + " reaches past the end of the file");
    if (e.method == 0 && e.compressed_size != e.size) throw damaged(what + " is stored with two different sizes");
    if (e.method == 8 && e.size / kMaxDeflateRatio > e.compressed_size)
      throw damaged(what + " declares " + std::to_string(e.size) + " bytes, more than its " +
                    std::to_string(e.compressed_size) + " compressed bytes can hold");
    if (e.method != 0 && e.method != 8)
      throw damaged(what + " uses compression method " + std::to_string(e.method) + " (torch.save stores records)");
    if (!out.by_name_.emplace(lower(e.name), out.entries_.size()).second)
      throw damaged("two records named '" + printable(e.name) + "'");
    out.entries_.push_back(std::move(e));
  }
  return out;
}

const ZipEntry* ZipDirectory::find(const std::string& name) const {
  auto it = by_name_.find(lower(name));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

}  // namespace h5ddp::interop

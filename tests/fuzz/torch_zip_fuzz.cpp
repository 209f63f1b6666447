// libFuzzer target: raw bytes as a whole torch.save file, through everything h5ddp-ckpt import does
// before LibTorch's reader: the zip directory (tools/ckpt_torch/zip_directory.cpp), the data.pkl record
// (read here from its stored bytes, as miniz would), the unpickler and the storage record sizes. miniz
// and LibTorch are not built with the fuzzer. A finding: any exception other than CheckpointError, a
// sanitizer report, or a read the directory code makes outside the file (trapped below).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "ckpt_torch/pickle.hpp"
#include "ckpt_torch/zip_directory.hpp"
#include "h5ddp/error.hpp"

namespace {

uint32_t le(const uint8_t* p, int n) {
  uint32_t v = 0;
  for (int i = n; i-- > 0;) v = v << 8 | p[i];
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace h5ddp::interop;
  const std::string file = "fuzz.pt";
  auto read_at = [&](uint64_t offset, char* buffer, size_t n) {
    if (offset > size || n > size - offset) __builtin_trap();  // the directory reader must stay inside
    std::memcpy(buffer, data + offset, n);
  };
  try {
    const ZipDirectory dir = ZipDirectory::read(file, size, read_at);
    for (const ZipEntry& e : dir.entries())  // its promise: each record's data may lie inside the file
      if (e.header_offset + 30 + e.compressed_size > size) __builtin_trap();
    if (dir.entries().empty()) return 0;
    const std::string& first = dir.entries()[0].name;
    const std::string folder = first.substr(0, first.find('/') + 1);
    const ZipEntry* pkl = dir.find(folder + "data.pkl");
    if (!pkl || pkl->method != 0) return 0;
    // The stored bytes follow the local header and its own name and extra field.
    const uint64_t at = pkl->header_offset;
    if (le(data + at, 4) != 0x04034b50) return 0;
    const uint64_t begin = at + 30 + le(data + at + 26, 2) + le(data + at + 28, 2);
    if (begin > size || pkl->size > size - begin) return 0;
    const Pickle p = unpickle(file, reinterpret_cast<const char*>(data + begin), pkl->size);
    check_storage_records(file, p, [&](const std::string& record) -> std::optional<uint64_t> {
      const ZipEntry* e = dir.find(folder + record);
      return e ? std::optional<uint64_t>(e->size) : std::nullopt;
    });
  } catch (const h5ddp::CheckpointError&) {
  }
  return 0;
}

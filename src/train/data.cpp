// IDX reader: big-endian header (magic, dims), then raw bytes; see http://yann.lecun.com/exdb/mnist/.
// gzread reads plain files too, so tests may use uncompressed fixtures.
#include "train/data.hpp"

#include <zlib.h>

#include <filesystem>
#include <memory>

#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr uint32_t kMaxDim = 1u << 24;         // guards against absurd sizes in corrupt headers

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

GzFile open_gz(const std::string& path) {
  if (!std::filesystem::exists(path)) throw DataError("data file not found: " + path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw DataError("cannot open data file " + path);
  gzbuffer(f, 1 << 20);
  return GzFile(f);
}

// "<what><path>: <zlib's message> (...)" for a failed gzread. zlib reads ahead (1 MiB buffers), so a failed
// CRC-32 or length check may surface at any read, not only at the last one.
std::string gz_problem(const char* what, gzFile f, const std::string& path) {
  int errnum = 0;
  std::string msg = gzerror(f, &errnum);
  if (msg.rfind(path + ": ", 0) == 0) msg.erase(0, path.size() + 2);  // zlib prefixes the path
  return what + path + ": " + (msg.empty() ? "zlib error" : msg) +
         " (the file's deflate data, or gzip's CRC-32 and length check, is wrong)";
}

// Reads exactly n bytes or throws DataError naming the file and what was being read.
void read_exact(gzFile f, void* dst, size_t n, const std::string& path, const char* what) {
  auto* p = static_cast<unsigned char*>(dst);
  size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    const int got = gzread(f, p + done, chunk);
    if (got < 0) throw DataError(gz_problem("corrupt data file ", f, path));
    if (got == 0) {
      throw DataError("truncated data file " + path + ": " + what + " needs " + std::to_string(n) + " bytes, got " +
                      std::to_string(done));
    }
    done += static_cast<size_t>(got);
  }
}

// After the last byte the header accounts for: the stream must end there, and gzip's own check (CRC-32 and
// length of the inflated data) must pass; zlib verifies it only when a read reaches the end of the stream.
void expect_end(gzFile f, const std::string& path, const std::string& what) {
  unsigned char extra[4096];
  uint64_t more = 0;
  for (;;) {
    const int got = gzread(f, extra, sizeof extra);
    if (got < 0) throw DataError(gz_problem("corrupt data file ", f, path));
    if (got == 0) break;
    more += static_cast<uint64_t>(got);
  }
  // gzread reports a stream cut short (no CRC-32 and length trailer) as an end of file; gzerror tells.
  int errnum = Z_OK;
  gzerror(f, &errnum);
  if (errnum != Z_OK) throw DataError(gz_problem("truncated data file ", f, path));
  if (more > 0)
    throw DataError("corrupt data file " + path + ": " + std::to_string(more) + " bytes follow the " + what +
                    " its header accounts for");
}

uint32_t read_be32(gzFile f, const std::string& path, const char* what) {
  unsigned char b[4];
  read_exact(f, b, 4, path, what);
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

}  // namespace

ImageDataset read_idx_dataset(const std::string& images_path, const std::string& labels_path,
                              const Normalization& norm) {
  ImageDataset ds;
  std::vector<unsigned char>& raw = ds.pixels;
  {
    GzFile f = open_gz(images_path);
    const uint32_t magic = read_be32(f.get(), images_path, "magic number");
    if (magic != kImagesMagic)
      throw DataError("not an IDX3 image file: " + images_path + " (magic " + hex(magic) + ", expected " +
                      hex(kImagesMagic) + ")");
    const uint32_t n = read_be32(f.get(), images_path, "image count");
    const uint32_t rows = read_be32(f.get(), images_path, "row count");
    const uint32_t cols = read_be32(f.get(), images_path, "column count");
    if (n == 0 || n > kMaxDim || rows == 0 || rows > 4096 || cols == 0 || cols > 4096)
      throw DataError("implausible dimensions in " + images_path + ": " + std::to_string(n) + " x " +
                      std::to_string(rows) + " x " + std::to_string(cols));
    ds.count = n;
    ds.rows = rows;
    ds.cols = cols;
    raw.resize(size_t(n) * rows * cols);
    read_exact(f.get(), raw.data(), raw.size(), images_path, "pixels");
    expect_end(f.get(), images_path, std::to_string(n) + " images");
  }
  ds.scale = 1.0f / (255.0f * norm.std);
  ds.shift = norm.mean / norm.std;

  GzFile f = open_gz(labels_path);
  const uint32_t magic = read_be32(f.get(), labels_path, "magic number");
  if (magic != kLabelsMagic)
    throw DataError("not an IDX1 label file: " + labels_path + " (magic " + hex(magic) + ", expected " +
                    hex(kLabelsMagic) + ")");
  const uint32_t n = read_be32(f.get(), labels_path, "label count");
  if (int64_t(n) != ds.count)
    throw DataError("label file " + labels_path + " has " + std::to_string(n) + " labels but " + images_path + " has " +
                    std::to_string(ds.count) + " images");
  std::vector<unsigned char> lab(n);
  read_exact(f.get(), lab.data(), lab.size(), labels_path, "labels");
  expect_end(f.get(), labels_path, std::to_string(n) + " labels");
  ds.labels.resize(n);
  for (size_t i = 0; i < lab.size(); ++i) {
    if (lab[i] > 9)
      throw DataError("label " + std::to_string(int(lab[i])) + " out of range [0, 10) at index " + std::to_string(i) +
                      " in " + labels_path);
    ds.labels[i] = lab[i];
  }
  return ds;
}

ImageDataset read_fashion_mnist(const std::string& dir, const std::string& split, const Normalization& norm) {
  if (split != "train" && split != "t10k") throw DataError("unknown data split '" + split + "' (train|t10k)");
  return read_idx_dataset(dir + "/" + split + "-images-idx3-ubyte.gz", dir + "/" + split + "-labels-idx1-ubyte.gz",
                          norm);
}

void check_fashion_mnist_dir(const std::string& dir) {
  if (!std::filesystem::is_directory(dir))
    throw DataError("data directory not found: " + dir +
                    " (apt-get install dataset-fashion-mnist, or pass --data-dir)");
  for (const char* split : {"train", "t10k"})
    for (const char* kind : {"images-idx3", "labels-idx1"}) {
      const std::string p = dir + "/" + split + "-" + kind + "-ubyte.gz";
      if (!std::filesystem::exists(p)) throw DataError("data file not found: " + p);
    }
}

}  // namespace h5ddp

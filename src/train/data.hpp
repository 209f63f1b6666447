// Fashion-MNIST (and MNIST) in the IDX format, read straight from the distribution's .gz files with zlib.
// Torch-free: images are normalised floats in a plain vector; the trainer wraps them without copying.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace h5ddp {

// Per-pixel normalisation applied after scaling bytes to [0, 1]: (x - mean) / std.
// Defaults are Fashion-MNIST's training-set statistics.
struct Normalization {
  float mean = 0.2860f;
  float std = 0.3530f;
};

struct ImageDataset {
  int64_t count = 0;
  int64_t rows = 0, cols = 0;
  // count * rows * cols bytes, C order, as in the file: a quarter of the memory of the normalised floats, which
  // pixel() computes when a batch is built (the same float arithmetic as normalising up front).
  std::vector<unsigned char> pixels;
  float scale = 1.0f, shift = 0.0f;  // normalised pixel = byte * scale - shift
  std::vector<int64_t> labels;       // count, each in [0, 10)

  int64_t image_size() const { return rows * cols; }
  float pixel(size_t i) const { return static_cast<float>(pixels[i]) * scale - shift; }
  std::vector<float> images() const {  // every pixel normalised
    std::vector<float> out(pixels.size());
    for (size_t i = 0; i < pixels.size(); ++i) out[i] = pixel(i);
    return out;
  }
};

// Local (not collective). Reads one IDX3 image file and its IDX1 label file (gzip or plain).
// Throws DataError naming the file on a missing file, a bad magic number, dimension mismatch,
// truncated data or a label out of range.
ImageDataset read_idx_dataset(const std::string& images_path, const std::string& labels_path,
                              const Normalization& norm = {});

// Local. Reads "<dir>/<split>-images-idx3-ubyte.gz" and "<dir>/<split>-labels-idx1-ubyte.gz";
// split is "train" or "t10k".
ImageDataset read_fashion_mnist(const std::string& dir, const std::string& split, const Normalization& norm = {});

// Local. Throws DataError unless `dir` holds the four Fashion-MNIST files (for early option validation).
void check_fashion_mnist_dir(const std::string& dir);

// The distribution's default location (Debian's dataset-fashion-mnist package).
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

}  // namespace h5ddp

#include "train/dataset.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

#include "h5ddp/error.hpp"
#include "h5ddp/h5_layout.hpp"

namespace h5ddp {

int64_t SampleSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SampleSpec::shape_text() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// ---- the built-in Fashion-MNIST, in memory ----

class ImagesDataset final : public Dataset {
 public:
  ImagesDataset(ImageDataset images, std::string name) : images_(std::move(images)), name_(std::move(name)) {
    spec_.shape = {1, images_.rows, images_.cols};
    spec_.num_classes = 10;
  }
  int64_t size() const override { return images_.count; }
  const SampleSpec& spec() const override { return spec_; }
  std::string describe() const override {
    return name_ + ": " + std::to_string(images_.count) + " samples " + spec_.shape_text();
  }
  std::string label_source() const override { return name_ + " labels"; }

  void read(const std::vector<int64_t>& indices, Rows& out) const override {
    const int64_t n = images_.image_size();
    out.x.resize(indices.size() * static_cast<size_t>(n));
    out.labels.resize(indices.size());
    for (size_t i = 0; i < indices.size(); ++i) {
      std::memcpy(out.x.data() + i * n, images_.images.data() + indices[i] * n, n * sizeof(float));
      out.labels[i] = images_.labels[indices[i]];
    }
  }

  void label_range(int64_t begin, int64_t end, int64_t& min, int64_t& max) const override {
    for (int64_t i = begin; i < end; ++i) {
      min = std::min(min, images_.labels[i]);
      max = std::max(max, images_.labels[i]);
    }
  }

 private:
  ImageDataset images_;
  std::string name_;
  SampleSpec spec_;
};

// ---- an HDF5 data file (docs/DATA.md) ----

enum class Kind { kU8, kF32, kInt };

struct Column {
  std::string name;  // "/train/x"
  Kind kind = Kind::kF32;
  size_t elem_bytes = 0;
  bool is_signed = false;
  std::vector<int64_t> dims;
  uint64_t offset = 0;     // file offset of row 0
  uint64_t row_bytes = 0;  // bytes of one row
};

class H5Dataset final : public Dataset {
 public:
  H5Dataset(std::string path, std::string split) : path_(std::move(path)), split_(std::move(split)) {}

  void open() {
    if (!std::filesystem::is_regular_file(path_)) throw DataError("--data " + path_ + ": no such file");
    if (!is_hdf5_file(path_)) throw DataError("--data " + path_ + ": not an HDF5 file");
    std::string why;
    const std::optional<H5LayoutFile> file = H5LayoutFile::open(path_, &why);
    if (!file) throw DataError("--data " + path_ + ": HDF5 cannot open it: " + why);
    const std::string g = "/" + split_;
    if (!file->exists(g)) throw DataError(where(g) + ": missing (docs/DATA.md)");
    x_ = column(*file, g + "/x");
    y_ = column(*file, g + "/y");
    check_x(*file);
    check_y();
    if (file->has_attribute("/", "num_classes")) spec_.num_classes = file->read_int_attribute("/", "num_classes");
    const uint64_t length = std::filesystem::file_size(path_);
    for (const Column* c : {&x_, &y_}) {
      const uint64_t end = c->offset + c->row_bytes * static_cast<uint64_t>(count_);
      if (end > length)
        throw DataError(where(c->name) + ": the file is cut short (" + std::to_string(length) +
                        " bytes, the dataset ends at " + std::to_string(end) + ")");
    }
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw DataError("--data " + path_ + ": " + std::strerror(errno));
  }

  ~H5Dataset() override {
    if (fd_ >= 0) ::close(fd_);
  }

  int64_t size() const override { return count_; }
  const SampleSpec& spec() const override { return spec_; }
  std::string describe() const override {
    return path_ + " /" + split_ + ": " + std::to_string(count_) + " samples " + spec_.shape_text() + " " +
           (x_.kind == Kind::kU8 ? "uint8" : "float32") +
           (spec_.classification ? ", integer labels" : ", float targets");
  }
  std::string label_source() const override { return path_ + " " + y_.name; }

  void read(const std::vector<int64_t>& indices, Rows& out) const override {
    const size_t n = indices.size();
    const int64_t numel = spec_.numel();
    std::vector<unsigned char> raw;
    read_rows(x_, indices, raw);
    out.x.resize(n * static_cast<size_t>(numel));
    const int64_t channels = spec_.shape[0], per_channel = numel / channels;
    for (size_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < channels; ++c) {
        float* dst = out.x.data() + r * numel + c * per_channel;
        const size_t first = r * numel + c * per_channel;
        const float scale = scale_[c], shift = shift_[c];
        if (x_.kind == Kind::kU8) {
          const unsigned char* src = raw.data() + first;
          for (int64_t i = 0; i < per_channel; ++i) dst[i] = float(src[i]) * scale - shift;
        } else {
          const float* src = reinterpret_cast<const float*>(raw.data()) + first;
          for (int64_t i = 0; i < per_channel; ++i) dst[i] = src[i] * scale - shift;
        }
      }
    read_rows(y_, indices, raw);
    if (spec_.classification) {
      out.labels.resize(n);
      for (size_t r = 0; r < n; ++r) out.labels[r] = label_at(raw.data(), r);
    } else {
      const size_t w = static_cast<size_t>(std::max<int64_t>(1, spec_.target_width));
      out.targets.resize(n * w);
      std::memcpy(out.targets.data(), raw.data(), n * w * sizeof(float));
    }
  }

  void label_range(int64_t begin, int64_t end, int64_t& min, int64_t& max) const override {
    constexpr int64_t kPiece = 1 << 16;
    std::vector<int64_t> idx;
    std::vector<unsigned char> raw;
    for (int64_t b = begin; b < end; b += kPiece) {
      idx.resize(static_cast<size_t>(std::min(end, b + kPiece) - b));
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = b + static_cast<int64_t>(i);
      read_rows(y_, idx, raw);
      for (size_t r = 0; r < idx.size(); ++r) {
        const int64_t v = label_at(raw.data(), r);
        min = std::min(min, v);
        max = std::max(max, v);
      }
    }
  }

 private:
  std::string where(const std::string& dataset) const { return "--data " + path_ + " " + dataset; }

  Column column(const H5LayoutFile& file, const std::string& name) const {
    if (!file.exists(name)) throw DataError(where(name) + ": missing (docs/DATA.md)");
    Column c;
    c.name = name;
    const std::optional<H5DatasetLayout> d = file.dataset(name);
    if (!d) throw DataError(where(name) + ": not a dataset");
    c.elem_bytes = d->element_bytes;
    if (d->byte_order != H5ByteOrder::kLittle && c.elem_bytes > 1)
      throw DataError(where(name) + ": big-endian data is not supported (rewrite it little-endian)");
    if (d->element_class == H5ElementClass::kFloat && c.elem_bytes == 4) {
      c.kind = Kind::kF32;
    } else if (d->element_class == H5ElementClass::kInteger &&
               (c.elem_bytes == 1 || c.elem_bytes == 2 || c.elem_bytes == 4 || c.elem_bytes == 8)) {
      c.kind = c.elem_bytes == 1 && !d->is_signed ? Kind::kU8 : Kind::kInt;
      c.is_signed = d->is_signed;
    } else {
      throw DataError(where(name) + ": unsupported type (x: uint8 or float32; y: an integer type or float32)");
    }
    c.dims = d->shape;
    if (c.dims.empty()) throw DataError(where(name) + ": a scalar, expected one row per sample");
    if (!d->contiguous)
      throw DataError(where(name) +
                      ": stored chunked or compressed; h5ddp reads contiguous datasets by file offset "
                      "(rewrite it: h5repack -l CONTI " +
                      path_ + " OUT.h5)");
    c.row_bytes = c.elem_bytes;
    for (size_t i = 1; i < c.dims.size(); ++i) c.row_bytes *= static_cast<uint64_t>(c.dims[i]);
    if (!d->offset) {
      if (c.dims[0] > 0 && c.row_bytes > 0) throw DataError(where(name) + ": has no data written");
      c.offset = 0;
    } else {
      c.offset = *d->offset;
    }
    return c;
  }

  void check_x(const H5LayoutFile& file) {
    if (x_.kind == Kind::kInt) throw DataError(where(x_.name) + ": unsupported type (uint8 or float32)");
    if (x_.dims.size() < 2) throw DataError(where(x_.name) + ": shape [N] has no sample dimension (expected [N, ...])");
    count_ = x_.dims[0];
    if (count_ == 0) throw DataError(where(x_.name) + ": no samples");
    spec_.shape.assign(x_.dims.begin() + 1, x_.dims.end());
    const int64_t channels = spec_.shape[0];
    const std::vector<float> mean = channel_attr(file, "mean", channels, 0.0f);
    const std::vector<float> std = channel_attr(file, "std", channels, 1.0f);
    for (int64_t c = 0; c < channels; ++c) {
      if (!(std[c] > 0)) throw DataError(where(x_.name) + ": attribute std must be > 0");
      // The built-in path's arithmetic (data.cpp), so a converted Fashion-MNIST trains bit for bit alike.
      scale_.push_back(x_.kind == Kind::kU8 ? 1.0f / (255.0f * std[c]) : 1.0f / std[c]);
      shift_.push_back(mean[c] / std[c]);
    }
  }

  // Attribute `name` of x: one value for every channel, or one per channel; `fallback` when there is none.
  std::vector<float> channel_attr(const H5LayoutFile& file, const char* name, int64_t channels, float fallback) const {
    std::vector<float> v(static_cast<size_t>(channels), fallback);
    const std::optional<H5AttributeInfo> info = file.attribute(x_.name, name);
    if (!info) return v;
    if (info->element_class == H5ElementClass::kOther)
      throw DataError(where(x_.name) + ": attribute " + name + " is not a number");
    const std::vector<int64_t>& dims = info->shape;
    const int64_t n = info->count();
    if (!(dims.empty() || (dims.size() == 1 && (n == 1 || n == channels))))
      throw DataError(where(x_.name) + ": attribute " + name + " has " + std::to_string(n) +
                      " values; expected 1 or one per channel (" + std::to_string(channels) + ")");
    std::vector<float> read;
    try {
      read = file.read_float_attribute(x_.name, name);
    } catch (const H5Error&) {
      throw DataError(where(x_.name) + ": cannot read attribute " + name);
    }
    for (int64_t c = 0; c < channels; ++c) v[c] = read[n == 1 ? 0 : c];
    return v;
  }

  void check_y() {
    if (y_.dims[0] != count_)
      throw DataError("--data " + path_ + ": " + x_.name + " has " + std::to_string(count_) + " rows but " + y_.name +
                      " has " + std::to_string(y_.dims[0]));
    if (y_.kind == Kind::kF32) {
      spec_.classification = false;
      if (y_.dims.size() > 2) throw DataError(where(y_.name) + ": float targets must be [N] or [N, K]");
      spec_.target_width = y_.dims.size() == 2 ? y_.dims[1] : 0;
    } else if (y_.dims.size() != 1) {
      throw DataError(where(y_.name) + ": integer labels must be [N]");
    }
  }

  int64_t label_at(const unsigned char* raw, size_t r) const {
    const unsigned char* p = raw + r * y_.elem_bytes;
    switch (y_.elem_bytes) {
      case 1:
        return y_.is_signed ? int64_t(int8_t(*p)) : int64_t(*p);
      case 2: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return y_.is_signed ? int64_t(int16_t(v)) : int64_t(v);
      }
      case 4: {
        uint32_t v;
        std::memcpy(&v, p, 4);
        return y_.is_signed ? int64_t(int32_t(v)) : int64_t(v);
      }
      default: {
        uint64_t v;
        std::memcpy(&v, p, 8);
        // An unsigned label beyond int64 range is out of any class range: keep it out of range.
        return y_.is_signed || v <= uint64_t(std::numeric_limits<int64_t>::max()) ? int64_t(v)
                                                                                  : std::numeric_limits<int64_t>::max();
      }
    }
  }

  // Rows `indices` of `c` into `raw`, one positional read per run of consecutive rows.
  void read_rows(const Column& c, const std::vector<int64_t>& indices, std::vector<unsigned char>& raw) const {
    raw.resize(indices.size() * c.row_bytes);
    size_t i = 0;
    while (i < indices.size()) {
      size_t j = i + 1;
      while (j < indices.size() && indices[j] == indices[j - 1] + 1) ++j;
      if (indices[i] < 0 || indices[j - 1] >= count_)
        throw DataError(where(c.name) + ": row " + std::to_string(indices[i]) + " outside [0, " +
                        std::to_string(count_) + ")");
      pread_all(c, indices[i], raw.data() + i * c.row_bytes, (j - i) * c.row_bytes);
      i = j;
    }
  }

  void pread_all(const Column& c, int64_t row, unsigned char* dst, size_t bytes) const {
    off_t at = static_cast<off_t>(c.offset + static_cast<uint64_t>(row) * c.row_bytes);
    while (bytes > 0) {
      const ssize_t got = ::pread(fd_, dst, bytes, at);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw DataError(where(c.name) + ": reading row " + std::to_string(row) +
                        " failed: " + (got < 0 ? std::strerror(errno) : "end of file"));
      dst += got;
      at += got;
      bytes -= static_cast<size_t>(got);
    }
  }

  std::string path_, split_;
  Column x_, y_;
  int64_t count_ = 0;
  SampleSpec spec_;
  std::vector<float> scale_, shift_;
  int fd_ = -1;
};

}  // namespace

std::unique_ptr<Dataset> images_dataset(ImageDataset images, std::string name) {
  return std::make_unique<ImagesDataset>(std::move(images), std::move(name));
}

std::unique_ptr<Dataset> open_h5_dataset(const std::string& path, const std::string& split) {
  auto d = std::make_unique<H5Dataset>(path, split);
  try {
    d->open();
  } catch (const H5Error& e) {
    throw DataError("--data " + path + " /" + split + ": " + e.what());
  }
  return d;
}

bool h5_dataset_has_split(const std::string& path, const std::string& split) {
  const std::optional<H5LayoutFile> file = H5LayoutFile::open(path);
  return file && file->exists("/" + split);
}

TrainData open_train_data(const std::string& data_file, const std::string& data_dir, bool with_test) {
  TrainData d;
  if (!data_file.empty()) {
    d.train = open_h5_dataset(data_file, "train");
    if (with_test) {
      if (!h5_dataset_has_split(data_file, "test"))
        throw DataError("--data " + data_file + " /test: missing; evaluation needs it (or pass --no-eval)");
      d.test = open_h5_dataset(data_file, "test");
    }
  } else {
    d.train = images_dataset(read_fashion_mnist(data_dir, "train"), "fashion-mnist train");
    if (with_test) d.test = images_dataset(read_fashion_mnist(data_dir, "t10k"), "fashion-mnist t10k");
  }
  if (d.test && d.test->spec().shape != d.train->spec().shape)
    throw DataError("--data " + data_file + ": /test samples are " + d.test->spec().shape_text() +
                    " but /train samples are " + d.train->spec().shape_text());
  return d;
}

}  // namespace h5ddp

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

namespace {

std::string dims_text(const std::vector<int64_t>& dims) {  // "[3, 32, 32]"
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

std::string SampleSpec::shape_text() const {
  return dims_text(shape);
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
      float* x = out.x.data() + i * n;
      const size_t first = static_cast<size_t>(indices[i] * n);
      for (int64_t k = 0; k < n; ++k) x[k] = images_.pixel(first + static_cast<size_t>(k));
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
  int64_t row_elems() const { return static_cast<int64_t>(row_bytes / elem_bytes); }
  std::string type_text() const {
    if (kind == Kind::kF32) return "float32";
    return std::string(is_signed ? "int" : "uint") + std::to_string(8 * elem_bytes);
  }
};

// Element `i` of little-endian integers `raw` of `c`'s type, as int64 (an unsigned value beyond int64's range
// comes back as int64's maximum: out of any id or class range).
int64_t int_at(const Column& c, const unsigned char* raw, size_t i) {
  const unsigned char* p = raw + i * c.elem_bytes;
  switch (c.elem_bytes) {
    case 1:
      return c.is_signed ? int64_t(int8_t(*p)) : int64_t(*p);
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return c.is_signed ? int64_t(int16_t(v)) : int64_t(v);
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return c.is_signed ? int64_t(int32_t(v)) : int64_t(v);
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return c.is_signed || v <= uint64_t(std::numeric_limits<int64_t>::max()) ? int64_t(v)
                                                                               : std::numeric_limits<int64_t>::max();
    }
  }
}

class H5Dataset final : public Dataset {
 public:
  H5Dataset(std::string path, std::string split, int64_t context)
      : path_(std::move(path)), split_(std::move(split)), context_(context) {}

  void open() {
    if (!std::filesystem::is_regular_file(path_)) throw DataError("--data " + path_ + ": no such file");
    if (!is_hdf5_file(path_)) throw DataError("--data " + path_ + ": not an HDF5 file");
    std::string why;
    const std::optional<H5LayoutFile> file = H5LayoutFile::open(path_, &why);
    if (!file) throw DataError("--data " + path_ + ": HDF5 cannot open it: " + why);
    const std::string g = "/" + split_;
    if (!file->exists(g)) throw DataError(where(g) + ": missing (docs/DATA.md)");
    if (file->has_attribute("/", "vocab_size")) {
      spec_.vocab_size = file->read_int_attribute("/", "vocab_size");
      if (spec_.vocab_size <= 0) throw DataError(where("/") + ": attribute vocab_size must be > 0");
    }
    std::vector<const Column*> columns;
    if (file->exists(g + "/tokens")) {
      if (file->exists(g + "/x") || file->exists(g + "/y"))
        throw DataError(where(g) + ": holds both tokens and x/y; a split is one or the other (docs/DATA.md)");
      open_stream(*file, g);
      columns = {&tokens_};
    } else {
      x_ = column(*file, g + "/x");
      y_ = column(*file, g + "/y");
      check_x(*file);
      check_y();
      columns = {&x_, &y_};
    }
    if (file->has_attribute("/", "num_classes")) spec_.num_classes = file->read_int_attribute("/", "num_classes");
    const uint64_t length = std::filesystem::file_size(path_);
    for (const Column* c : columns) {
      const uint64_t end = c->offset + c->row_bytes * static_cast<uint64_t>(c->dims[0]);
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
    const std::string head = path_ + " /" + split_ + ": " + std::to_string(count_);
    const std::string vocab = "vocab_size " + std::to_string(spec_.vocab_size);
    if (spec_.stream)
      return head + " windows of " + std::to_string(context()) + " tokens (a stream of " +
             std::to_string(tokens_.dims[0]) + " " + tokens_.type_text() + " tokens, " + vocab + "): next-token labels";
    if (spec_.tokens)
      return head + " samples of " + std::to_string(context()) + " " + x_.type_text() + " tokens (" + vocab + "), " +
             (spec_.per_position ? "per-position labels" : "integer labels");
    return head + " samples " + spec_.shape_text() + " " + x_.type_text() +
           (spec_.classification ? ", integer labels" : ", float targets");
  }
  std::string label_source() const override { return path_ + " " + (spec_.stream ? tokens_.name : y_.name); }
  std::string token_source() const override { return path_ + " " + (spec_.stream ? tokens_.name : x_.name); }

  void read(const std::vector<int64_t>& indices, Rows& out) const override {
    if (spec_.stream) return read_windows(indices, out);
    const size_t n = indices.size();
    std::vector<unsigned char> raw;
    read_rows(x_, indices, raw);
    if (spec_.tokens) {
      out.ids.resize(n * static_cast<size_t>(context()));
      for (size_t i = 0; i < out.ids.size(); ++i) out.ids[i] = int_at(x_, raw.data(), i);
    } else {
      normalise(raw, n, out.x);
    }
    read_rows(y_, indices, raw);
    if (spec_.classification) {
      out.labels.resize(n * static_cast<size_t>(y_.row_elems()));
      for (size_t i = 0; i < out.labels.size(); ++i) out.labels[i] = int_at(y_, raw.data(), i);
    } else {
      const size_t w = static_cast<size_t>(std::max<int64_t>(1, spec_.target_width));
      out.targets.resize(n * w);
      std::memcpy(out.targets.data(), raw.data(), n * w * sizeof(float));
    }
  }

  void label_range(int64_t begin, int64_t end, int64_t& min, int64_t& max) const override {
    if (spec_.stream) return scan(tokens_, begin * context() + 1, (end - begin) * context(), false, min, max);
    const int64_t w = y_.row_elems();
    scan(y_, begin * w, (end - begin) * w, spec_.per_position, min, max);
  }

  void token_range(int64_t begin, int64_t end, int64_t& min, int64_t& max) const override {
    if (spec_.stream)  // windows [begin, end) hold tokens [begin * T, end * T + 1), their labels included
      return scan(tokens_, begin * context(), end > begin ? (end - begin) * context() + 1 : 0, false, min, max);
    if (spec_.tokens) scan(x_, begin * context(), (end - begin) * context(), false, min, max);
  }

 private:
  std::string where(const std::string& dataset) const { return "--data " + path_ + " " + dataset; }
  int64_t context() const { return spec_.shape[0]; }

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
      throw DataError(where(name) +
                      ": unsupported type (x: uint8 or float32, or integer token ids; y: an integer "
                      "type or float32; tokens: an integer type)");
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

  // A token stream /S/tokens [L]: windows of T + 1 tokens at i * T (docs/DATA.md "Token data").
  void open_stream(const H5LayoutFile& file, const std::string& g) {
    tokens_ = column(file, g + "/tokens");
    if (tokens_.kind == Kind::kF32 || tokens_.dims.size() != 1)
      throw DataError(where(tokens_.name) + ": a token stream is a 1-D integer dataset [L] (uint16 or uint32)");
    if (spec_.vocab_size <= 0)
      throw DataError(where(tokens_.name) + ": token data needs the root attribute vocab_size (docs/DATA.md)");
    int64_t t = context_;
    if (t <= 0 && file.has_attribute(tokens_.name, "context")) t = file.read_int_attribute(tokens_.name, "context");
    if (t <= 0)
      throw DataError(where(tokens_.name) + ": no window length: give it a `context` attribute or pass --context T");
    const int64_t length = tokens_.dims[0];
    if (length < t + 1)
      throw DataError(where(tokens_.name) + ": the stream holds " + std::to_string(length) +
                      " tokens, shorter than one window of " + std::to_string(t + 1) + " (context " +
                      std::to_string(t) + " and the next token)");
    count_ = (length - 1) / t;
    spec_.shape = {t};
    spec_.tokens = spec_.per_position = spec_.stream = true;
  }

  void check_x(const H5LayoutFile& file) {
    if (x_.dims.size() < 2) throw DataError(where(x_.name) + ": shape [N] has no sample dimension (expected [N, ...])");
    count_ = x_.dims[0];
    if (count_ == 0) throw DataError(where(x_.name) + ": no samples");
    spec_.shape.assign(x_.dims.begin() + 1, x_.dims.end());
    if (x_.kind != Kind::kF32 && spec_.vocab_size > 0) {  // token ids [N, T]
      if (x_.dims.size() != 2) throw DataError(where(x_.name) + ": token samples must be [N, T]");
      for (const char* a : {"mean", "std"})
        if (file.has_attribute(x_.name, a))
          throw DataError(where(x_.name) + ": token ids are not normalised; remove attribute " + a);
      spec_.tokens = true;
      return;
    }
    if (spec_.vocab_size > 0)
      throw DataError(where(x_.name) + ": float32 samples in a file with vocab_size (token data: x holds integer ids)");
    if (x_.kind == Kind::kInt)
      throw DataError(where(x_.name) +
                      ": integer samples other than uint8 are token ids and need the root attribute vocab_size "
                      "(docs/DATA.md); images and features are uint8 or float32");
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
    } else if (spec_.tokens && y_.dims.size() > 1) {
      if (y_.dims.size() != 2 || y_.dims[1] != context())
        throw DataError(where(y_.name) + ": the label shape " + dims_text(y_.dims) + " does not match the samples' " +
                        dims_text(x_.dims) + " (per-position labels are [N, T], one per token)");
      spec_.per_position = true;
    } else if (y_.dims.size() != 1) {
      throw DataError(where(y_.name) + ": integer labels must be [N]" +
                      (spec_.tokens ? " or, per position, [N, T]" : ""));
    }
  }

  // uint8 or float32 rows `raw` to normalised floats (docs/DATA.md "Normalisation").
  void normalise(const std::vector<unsigned char>& raw, size_t n, std::vector<float>& x) const {
    const int64_t numel = spec_.numel();
    x.resize(n * static_cast<size_t>(numel));
    const int64_t channels = spec_.shape[0], per_channel = numel / channels;
    for (size_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < channels; ++c) {
        float* dst = x.data() + r * numel + c * per_channel;
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
  }

  // A stream's windows `indices`: ids = tokens [i*T, i*T + T), labels = tokens [i*T + 1, i*T + T + 1).
  void read_windows(const std::vector<int64_t>& indices, Rows& out) const {
    const int64_t t = context();
    out.ids.resize(indices.size() * static_cast<size_t>(t));
    out.labels.resize(out.ids.size());
    std::vector<unsigned char> raw(static_cast<size_t>(t + 1) * tokens_.elem_bytes);
    for (size_t r = 0; r < indices.size(); ++r) {
      if (indices[r] < 0 || indices[r] >= count_)
        throw DataError(where(tokens_.name) + ": window " + std::to_string(indices[r]) + " outside [0, " +
                        std::to_string(count_) + ")");
      pread_all(tokens_, indices[r] * t, raw.data(), raw.size());
      for (int64_t k = 0; k < t; ++k) {
        out.ids[r * t + k] = int_at(tokens_, raw.data(), static_cast<size_t>(k));
        out.labels[r * t + k] = int_at(tokens_, raw.data(), static_cast<size_t>(k + 1));
      }
    }
  }

  // The smallest and largest value of elements [first, first + count) of integer column `c` (a contiguous run of
  // the file), read in bounded pieces; `skip_ignored`: kIgnoreLabel values are left out.
  void scan(const Column& c, int64_t first, int64_t count, bool skip_ignored, int64_t& min, int64_t& max) const {
    constexpr int64_t kPiece = 1 << 18;
    std::vector<unsigned char> raw;
    const int64_t per_row = c.row_elems();
    for (int64_t b = first; b < first + count; b += kPiece) {
      const int64_t n = std::min(first + count, b + kPiece) - b;
      raw.resize(static_cast<size_t>(n) * c.elem_bytes);
      pread_bytes(c, c.offset + static_cast<uint64_t>(b) * c.elem_bytes, b / per_row, raw.data(), raw.size());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = int_at(c, raw.data(), static_cast<size_t>(i));
        if (skip_ignored && v == SampleSpec::kIgnoreLabel) continue;
        min = std::min(min, v);
        max = std::max(max, v);
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
    pread_bytes(c, c.offset + static_cast<uint64_t>(row) * c.row_bytes, row, dst, bytes);
  }

  // `bytes` at file offset `at` (in column `c`, from row `row`, for the error) into `dst`.
  void pread_bytes(const Column& c, uint64_t at, int64_t row, unsigned char* dst, size_t bytes) const {
    off_t pos = static_cast<off_t>(at);
    while (bytes > 0) {
      const ssize_t got = ::pread(fd_, dst, bytes, pos);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw DataError(where(c.name) + ": reading row " + std::to_string(row) +
                        " failed: " + (got < 0 ? std::strerror(errno) : "end of file"));
      dst += got;
      pos += got;
      bytes -= static_cast<size_t>(got);
    }
  }

  std::string path_, split_;
  int64_t context_ = 0;  // --context (0: the stream's attribute)
  Column x_, y_, tokens_;
  int64_t count_ = 0;
  SampleSpec spec_;
  std::vector<float> scale_, shift_;
  int fd_ = -1;
};

}  // namespace

std::unique_ptr<Dataset> images_dataset(ImageDataset images, std::string name) {
  return std::make_unique<ImagesDataset>(std::move(images), std::move(name));
}

std::unique_ptr<Dataset> open_h5_dataset(const std::string& path, const std::string& split, int64_t context) {
  auto d = std::make_unique<H5Dataset>(path, split, context);
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

TrainData open_train_data(const std::string& data_file, const std::string& data_dir, bool with_test, int64_t context) {
  TrainData d;
  if (!data_file.empty()) {
    d.train = open_h5_dataset(data_file, "train", context);
    const SampleSpec& train = d.train->spec();
    if (context > 0 && !train.stream)
      throw DataError("--context " + std::to_string(context) + ": --data " + data_file +
                      " /train is not a token stream; its samples have a fixed shape " + train.shape_text());
    if (with_test) {
      if (!h5_dataset_has_split(data_file, "test"))
        throw DataError("--data " + data_file + " /test: missing; evaluation needs it (or pass --no-eval)");
      // A stream's test windows are as long as the training windows.
      d.test = open_h5_dataset(data_file, "test", train.stream ? train.shape[0] : 0);
    }
  } else {
    d.train = images_dataset(read_fashion_mnist(data_dir, "train"), "fashion-mnist train");
    if (with_test) d.test = images_dataset(read_fashion_mnist(data_dir, "t10k"), "fashion-mnist t10k");
  }
  if (!d.test) return d;
  const SampleSpec &train = d.train->spec(), &test = d.test->spec();
  if (test.shape != train.shape)
    throw DataError("--data " + data_file + ": /test samples are " + test.shape_text() + " but /train samples are " +
                    train.shape_text());
  if (test.tokens != train.tokens || test.per_position != train.per_position ||
      test.classification != train.classification || test.target_width != train.target_width)
    throw DataError("--data " + data_file + ": /test is not the same kind of data as /train (" + d.test->describe() +
                    "; " + d.train->describe() + ")");
  return d;
}

}  // namespace h5ddp

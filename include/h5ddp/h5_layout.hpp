// The layout of an HDF5 file, read without HDF5 in the caller: whether a file is HDF5, which objects it holds, how
// a dataset is stored (element type, shape, and for a contiguous dataset the file offset of its first element,
// so a reader may pread its rows with no HDF5 call, beside an asynchronous checkpoint save), and small numeric
// attributes. Files are opened read-only by one process (sec2 driver). HDF5 prints nothing: every failure comes
// back as a value or an exception. Includes no HDF5 header (docs/DATA.md; h5ddp-train's --data reader).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace h5ddp {

// Local. True when `path` exists and starts with the HDF5 signature.
bool is_hdf5_file(const std::string& path);

// The class of a dataset's or attribute's elements.
enum class H5ElementClass { kInteger, kFloat, kOther };  // kOther: strings, compounds, enums, ...
// The byte order of its elements. kOther: a type without one order (strings, compounds).
enum class H5ByteOrder { kLittle, kBig, kOther };

// How one dataset is stored.
struct H5DatasetLayout {
  std::string name;  // as given, e.g. "/train/x"
  H5ElementClass element_class = H5ElementClass::kOther;
  size_t element_bytes = 0;
  H5ByteOrder byte_order = H5ByteOrder::kOther;
  bool is_signed = false;      // integers only: two's complement; false for every other class
  std::vector<int64_t> shape;  // empty: a scalar (or a null dataspace)
  // Contiguous layout and no external storage: the elements lie in this file in C order, in one run. False for
  // chunked (so also compressed), compact, virtual and external datasets.
  bool contiguous = false;
  // Contiguous only: the file offset of element 0; std::nullopt when no storage was allocated (nothing written).
  std::optional<uint64_t> offset;
  // Bytes of all elements (element_bytes times the product of shape).
  uint64_t bytes() const;
  // Whether its bytes may be read straight from the file: contiguous, and stored (or empty).
  bool directly_readable() const { return contiguous && (offset.has_value() || bytes() == 0); }
};

// A numeric attribute's type and shape.
struct H5AttributeInfo {
  H5ElementClass element_class = H5ElementClass::kOther;
  std::vector<int64_t> shape;  // empty: a scalar
  int64_t count() const;       // number of values (1 for a scalar)
};

// An HDF5 file open read-only to read its layout. Move-only; closes the file when destroyed. No method is
// collective; a file is used by one thread at a time.
class H5LayoutFile {
 public:
  // Local. Opens `path` read-only. std::nullopt when HDF5 cannot open it; then `why`, when given, is HDF5's
  // innermost error text (e.g. "truncated file: eof = 1000, ..."), "" when HDF5 gave none.
  static std::optional<H5LayoutFile> open(const std::string& path, std::string* why = nullptr);
  ~H5LayoutFile();
  H5LayoutFile(H5LayoutFile&& other) noexcept;
  H5LayoutFile& operator=(H5LayoutFile&& other) noexcept;
  H5LayoutFile(const H5LayoutFile&) = delete;
  H5LayoutFile& operator=(const H5LayoutFile&) = delete;

  const std::string& path() const { return path_; }
  // Local. Whether `object` (absolute, e.g. "/train" or "/train/x") names a link that exists; false when any
  // component is missing. "/" always exists.
  bool exists(const std::string& object) const;
  // Local. How dataset `name` is stored; std::nullopt when `name` cannot be opened as a dataset (missing, a
  // group). Throws H5Error naming the file and the dataset when HDF5 fails on an open dataset.
  std::optional<H5DatasetLayout> dataset(const std::string& name) const;
  // Local. Whether `object` ("/" for the file) has attribute `attr`; false when either is missing.
  bool has_attribute(const std::string& object, const std::string& attr) const;
  // Local. Class and shape of attribute `attr` of `object`; std::nullopt when there is none. Throws H5Error
  // naming the file, the object and the attribute when HDF5 cannot describe it.
  std::optional<H5AttributeInfo> attribute(const std::string& object, const std::string& attr) const;
  // Local. The values of a numeric (integer or float) attribute converted to float, in C order. Throws H5Error
  // naming the file, the object and the attribute when it is missing or HDF5 cannot read it as float.
  std::vector<float> read_float_attribute(const std::string& object, const std::string& attr) const;
  // Local. A one-value integer attribute. Throws H5Error naming the attribute when it is missing, not an integer
  // or not one value.
  int64_t read_int_attribute(const std::string& object, const std::string& attr) const;

 private:
  H5LayoutFile(int64_t id, std::string path) : id_(id), path_(std::move(path)) {}
  int64_t id_ = -1;  // the hid_t of the open file
  std::string path_;
};

}  // namespace h5ddp

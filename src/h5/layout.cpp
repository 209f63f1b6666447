// include/h5ddp/h5_layout.hpp over the RAII layer of h5.hpp.
#include <type_traits>

#include "h5/h5.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/h5_layout.hpp"

namespace h5ddp {

static_assert(std::is_same_v<hid_t, int64_t>, "H5LayoutFile keeps the file's hid_t as int64_t");

namespace {

H5ElementClass element_class(H5T_class_t cls) {
  if (cls == H5T_INTEGER) return H5ElementClass::kInteger;
  if (cls == H5T_FLOAT) return H5ElementClass::kFloat;
  return H5ElementClass::kOther;
}

H5ByteOrder byte_order(hid_t type) {
  const H5T_order_t order = H5Tget_order(type);
  if (order == H5T_ORDER_LE) return H5ByteOrder::kLittle;
  if (order == H5T_ORDER_BE) return H5ByteOrder::kBig;
  return H5ByteOrder::kOther;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Type, shape and storage of an open dataset.
H5DatasetLayout describe(hid_t ds, const std::string& name) {
  H5DatasetLayout d;
  d.name = name;
  h5::Handle type = h5::datatype(H5Dget_type(ds));
  const H5T_class_t cls = H5Tget_class(type);
  d.element_class = element_class(cls);
  d.element_bytes = H5Tget_size(type);
  d.byte_order = byte_order(type);
  d.is_signed = cls == H5T_INTEGER && H5Tget_sign(type) != H5T_SGN_NONE;
  d.shape = h5::space_shape(h5::dataspace(H5Dget_space(ds)));
  h5::Handle dcpl = h5::plist(H5Dget_create_plist(ds));
  d.contiguous = H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_external_count(dcpl) <= 0;
  if (d.contiguous) {
    const haddr_t offset = H5Dget_offset(ds);
    if (offset != HADDR_UNDEF) d.offset = offset;
  }
  return d;
}

}  // namespace

uint64_t H5DatasetLayout::bytes() const {
  return static_cast<uint64_t>(element_bytes) * static_cast<uint64_t>(product(shape));
}

int64_t H5AttributeInfo::count() const {
  return product(shape);
}

bool is_hdf5_file(const std::string& path) {
  return h5::is_hdf5_file(path);
}

std::optional<H5LayoutFile> H5LayoutFile::open(const std::string& path, std::string* why) {
  h5::SilenceErrors quiet;
  h5::Handle fapl = h5::serial_file_access();
  h5::read_any_format_version(fapl);
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  if (id < 0) {
    if (why) *why = h5::innermost_error_text();  // before any other call clears the stack
    return std::nullopt;
  }
  return H5LayoutFile(id, path);
}

H5LayoutFile::~H5LayoutFile() {
  if (id_ >= 0) h5::Handle close_it(id_, H5Fclose);  // logs a failed close, never throws
}

H5LayoutFile::H5LayoutFile(H5LayoutFile&& other) noexcept : id_(other.id_), path_(std::move(other.path_)) {
  other.id_ = -1;
}

H5LayoutFile& H5LayoutFile::operator=(H5LayoutFile&& other) noexcept {
  if (this != &other) {
    H5LayoutFile old(std::move(*this));  // closes ours
    id_ = other.id_;
    path_ = std::move(other.path_);
    other.id_ = -1;
  }
  return *this;
}

bool H5LayoutFile::exists(const std::string& object) const {
  return object == "/" || h5::exists(id_, object);
}

std::optional<H5DatasetLayout> H5LayoutFile::dataset(const std::string& name) const {
  h5::SilenceErrors quiet;
  const hid_t raw = H5Dopen2(id_, name.c_str(), H5P_DEFAULT);
  if (raw < 0) return std::nullopt;
  h5::Handle ds = h5::dataset(raw);
  return with_context("describing " + path_ + " " + name, [&] { return describe(ds, name); });
}

bool H5LayoutFile::has_attribute(const std::string& object, const std::string& attr) const {
  h5::SilenceErrors quiet;
  return exists(object) && H5Aexists_by_name(id_, object.c_str(), attr.c_str(), H5P_DEFAULT) > 0;
}

std::optional<H5AttributeInfo> H5LayoutFile::attribute(const std::string& object, const std::string& attr) const {
  if (!has_attribute(object, attr)) return std::nullopt;
  return with_context("reading " + path_ + " " + object + " attribute " + attr, [&] {
    h5::SilenceErrors quiet;
    h5::Handle a = h5::attribute(H5Aopen_by_name(id_, object.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT));
    h5::Handle type = h5::datatype(H5Aget_type(a));
    H5AttributeInfo info;
    info.element_class = element_class(H5Tget_class(type));
    info.shape = h5::space_shape(h5::dataspace(H5Aget_space(a)));
    return info;
  });
}

std::vector<float> H5LayoutFile::read_float_attribute(const std::string& object, const std::string& attr) const {
  return with_context("reading " + path_ + " " + object + " attribute " + attr, [&] {
    h5::SilenceErrors quiet;
    h5::Handle a = h5::attribute(H5Aopen_by_name(id_, object.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT));
    const hssize_t n = H5Sget_simple_extent_npoints(h5::dataspace(H5Aget_space(a)));
    H5DDP_CHECK_H5(n);
    std::vector<float> values(static_cast<size_t>(n));
    H5DDP_CHECK_H5(H5Aread(a, H5T_NATIVE_FLOAT, values.data()));
    return values;
  });
}

int64_t H5LayoutFile::read_int_attribute(const std::string& object, const std::string& attr) const {
  h5::SilenceErrors quiet;
  if (object == "/") return h5::read_attr_int(id_, attr);  // on the file itself
  h5::Handle o(H5Oopen(id_, object.c_str(), H5P_DEFAULT), H5Oclose);
  if (!o.valid()) throw H5Error("cannot open " + path_ + " " + object + " (reading its attribute " + attr + ")");
  return h5::read_attr_int(o, attr);
}

}  // namespace h5ddp

#include "h5/h5.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"

namespace h5ddp {
namespace detail {

// Declared in error.hpp, defined here because only this layer links HDF5.
void throw_h5_error(const char* expr, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::string where = std::string(base ? base + 1 : file) + ":" + std::to_string(line);
  std::string stack = h5::error_stack_text();
  throw H5Error(std::string(expr) + " failed (" + where + ")" + (stack.empty() ? "" : "\n" + stack));
}

}  // namespace detail

namespace h5 {
namespace {

herr_t walk_cb(unsigned n, const H5E_error2_t* e, void* client) {
  auto* out = static_cast<std::string*>(client);
  char maj[128] = "?", min[128] = "?";
  H5Eget_msg(e->maj_num, nullptr, maj, sizeof(maj));
  H5Eget_msg(e->min_num, nullptr, min, sizeof(min));
  *out += "    HDF5 #" + std::to_string(n) + ": " + maj + ": " + min + " (" + (e->func_name ? e->func_name : "?") +
          (e->desc && *e->desc ? ": " + std::string(e->desc) : std::string()) + ")\n";
  return 0;
}

Handle checked(hid_t id, Handle::Closer closer, const char* what) {
  if (id < 0) detail::throw_h5_error(what, __FILE__, __LINE__);
  return Handle(id, closer);
}

}  // namespace

std::string error_stack_text() {
  std::string out;
  hid_t stack = H5Eget_current_stack();
  if (stack < 0) return out;
  H5Ewalk2(stack, H5E_WALK_DOWNWARD, walk_cb, &out);
  H5Eclose_stack(stack);
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string innermost_error_text() {
  struct Last {
    std::string text;
  } last;
  hid_t stack = H5Eget_current_stack();
  if (stack < 0) return "";
  H5Ewalk2(
      stack, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* client) -> herr_t {
        char min[128] = "?";
        H5Eget_msg(e->min_num, nullptr, min, sizeof(min));
        static_cast<Last*>(client)->text = std::string(min) + (e->desc && *e->desc ? ": " + std::string(e->desc) : "");
        return 0;
      },
      &last);
  H5Eclose_stack(stack);
  return last.text;
}

Handle::~Handle() {
  if (id_ >= 0 && closer_) {
    SilenceErrors quiet;
    if (closer_(id_) < 0) log::warn("closing an HDF5 handle failed: " + error_stack_text());
  }
}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    if (id_ >= 0 && closer_) {
      SilenceErrors quiet;
      closer_(id_);
    }
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::close() {
  if (id_ < 0) return;
  hid_t id = id_;
  id_ = H5I_INVALID_HID;
  SilenceErrors quiet;
  if (closer_ && closer_(id) < 0) detail::throw_h5_error("closing HDF5 object", __FILE__, __LINE__);
}

hid_t Handle::release() {
  hid_t id = id_;
  id_ = H5I_INVALID_HID;
  return id;
}

Handle file(hid_t id) {
  return checked(id, H5Fclose, "H5Fopen/H5Fcreate");
}
Handle group(hid_t id) {
  return checked(id, H5Gclose, "H5Gopen/H5Gcreate");
}
Handle dataset(hid_t id) {
  return checked(id, H5Dclose, "H5Dopen/H5Dcreate");
}
Handle dataspace(hid_t id) {
  return checked(id, H5Sclose, "H5S call");
}
Handle datatype(hid_t id) {
  return checked(id, H5Tclose, "H5T call");
}
Handle attribute(hid_t id) {
  return checked(id, H5Aclose, "H5Aopen/H5Acreate");
}
Handle plist(hid_t id) {
  return checked(id, H5Pclose, "H5Pcreate");
}

SilenceErrors::SilenceErrors() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

SilenceErrors::~SilenceErrors() {
  H5Eset_auto2(H5E_DEFAULT, func_, data_);
}

std::string hdf5_library_conflict() {
  Dl_info create{}, mpio{};
  if (!dladdr(reinterpret_cast<void*>(&H5Fcreate), &create) ||
      !dladdr(reinterpret_cast<void*>(&H5Pset_fapl_mpio), &mpio) || !create.dli_fname || !mpio.dli_fname)
    return "";  // statically linked, or no symbol information: nothing to compare
  if (std::strcmp(create.dli_fname, mpio.dli_fname) == 0) return "";
  return std::string("two HDF5 libraries in this process: H5Fcreate binds to ") + create.dli_fname +
         " but H5Pset_fapl_mpio to " + mpio.dli_fname +
         " (Debian's LibTorch links the serial HDF5; link h5ddp, and its parallel HDF5, before LibTorch)";
}

Handle mpio_file_access(MPI_Comm comm, const MpioOptions& options) {
  // Every rank runs the same binary, so this fails on all of them or on none.
  static const std::string conflict = hdf5_library_conflict();
  H5DDP_CHECK(conflict.empty(), conflict);
  Handle fapl = plist(H5Pcreate(H5P_FILE_ACCESS));
  MPI_Info info;
  MPI_Info_create(&info);
  // Large collective buffers suit multi-MiB tensors; data sieving only pays for small strided writes,
  // and every write h5ddp issues is a contiguous run of whole rows.
  MPI_Info_set(info, "cb_buffer_size", "16777216");
  MPI_Info_set(info, "romio_ds_write", "disable");
  MPI_Info_set(info, "romio_cb_write", "automatic");
  MPI_Info_set(info, "romio_cb_read", "automatic");
  for (const auto& [k, v] : options.hints) MPI_Info_set(info, k.c_str(), v.c_str());
  herr_t rc = H5Pset_fapl_mpio(fapl, comm, info);
  MPI_Info_free(&info);
  H5DDP_CHECK_H5(rc);
  H5DDP_CHECK_H5(H5Pset_all_coll_metadata_ops(fapl, true));
  H5DDP_CHECK_H5(H5Pset_coll_metadata_write(fapl, true));
  // Dirty metadata is written (collectively) only at sync points, which parallel HDF5 holds whenever this much
  // of it has accumulated (default 256 KiB); entries written there may be evicted, and touching one again (the
  // checksum attribute a save adds to every dataset after the writes) re-reads it on rank 0 and broadcasts it:
  // one collective per dataset, 3,851 of them for a save of 3,000 tensors at any rank count (issue 42,
  // docs/SCALING.md). With 32 MiB the object headers of ~30,000 datasets stay in the cache until the close
  // writes them in one collective pass.
  H5AC_cache_config_t cache{};
  cache.version = H5AC__CURR_CACHE_CONFIG_VERSION;
  H5DDP_CHECK_H5(H5Pget_mdc_config(fapl, &cache));
  cache.dirty_bytes_threshold = 32 << 20;
  H5DDP_CHECK_H5(H5Pset_mdc_config(fapl, &cache));
  if (options.alignment > 1) H5DDP_CHECK_H5(H5Pset_alignment(fapl, options.alignment_threshold, options.alignment));
  H5DDP_CHECK_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_EARLIEST, H5F_LIBVER_V18));
  return fapl;
}

Handle serial_file_access() {
  Handle fapl = plist(H5Pcreate(H5P_FILE_ACCESS));
  H5DDP_CHECK_H5(H5Pset_fapl_sec2(fapl));
  H5DDP_CHECK_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_EARLIEST, H5F_LIBVER_V18));
  return fapl;
}

void read_any_format_version(hid_t fapl) {
  H5DDP_CHECK_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_EARLIEST, H5F_LIBVER_LATEST));
}

Handle transfer(bool collective) {
  Handle dxpl = plist(H5Pcreate(H5P_DATASET_XFER));
  H5DDP_CHECK_H5(H5Pset_dxpl_mpio(dxpl, collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT));
  return dxpl;
}

bool exists(hid_t loc, const std::string& path) {
  // H5Lexists fails (instead of returning false) when an intermediate group is missing: check each prefix.
  SilenceErrors quiet;
  size_t pos = path[0] == '/' ? 1 : 0;
  while (true) {
    size_t next = path.find('/', pos);
    std::string prefix = path.substr(0, next);
    if (!prefix.empty() && prefix != "/" && H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (next == std::string::npos) return true;
    pos = next + 1;
  }
}

std::vector<std::string> children(hid_t loc, const std::string& path) {
  std::vector<std::string> names;
  Handle g = group(H5Gopen2(loc, path.c_str(), H5P_DEFAULT));
  auto cb = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  H5DDP_CHECK_H5(H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &names));
  return names;
}

Handle create_group(hid_t loc, const std::string& path) {
  Handle lcpl = plist(H5Pcreate(H5P_LINK_CREATE));
  H5DDP_CHECK_H5(H5Pset_create_intermediate_group(lcpl, 1));
  return group(H5Gcreate2(loc, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
}

namespace {
Handle half_type() {
  Handle t = datatype(H5Tcopy(H5T_IEEE_F32LE));
  // IEEE binary16: sign at bit 15, exponent bits 10..14 (bias 15), mantissa bits 0..9.
  H5DDP_CHECK_H5(H5Tset_fields(t, 15, 10, 5, 0, 10));
  H5DDP_CHECK_H5(H5Tset_size(t, 2));
  H5DDP_CHECK_H5(H5Tset_ebias(t, 15));
  return t;
}
}  // namespace

Handle file_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return datatype(H5Tcopy(H5T_IEEE_F32LE));
    case DType::kF64:
      return datatype(H5Tcopy(H5T_IEEE_F64LE));
    case DType::kF16:
      return half_type();
    case DType::kBF16:
      return datatype(H5Tcopy(H5T_STD_U16LE));
    case DType::kI64:
      return datatype(H5Tcopy(H5T_STD_I64LE));
    case DType::kI32:
      return datatype(H5Tcopy(H5T_STD_I32LE));
    case DType::kI16:
      return datatype(H5Tcopy(H5T_STD_I16LE));
    case DType::kI8:
      return datatype(H5Tcopy(H5T_STD_I8LE));
    case DType::kU8:
      return datatype(H5Tcopy(H5T_STD_U8LE));
    case DType::kU64:
      return datatype(H5Tcopy(H5T_STD_U64LE));
    case DType::kBool:
      return datatype(H5Tcopy(H5T_STD_U8LE));
  }
  throw H5Error("no HDF5 type for dtype");
}

Handle memory_type(DType dtype) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "h5ddp writes host bytes as little endian");
  return file_type(dtype);  // identical on a little-endian host: no conversion, bytes go straight through
}

Handle fixed_string_type(size_t size) {
  Handle t = datatype(H5Tcopy(H5T_C_S1));
  H5DDP_CHECK_H5(H5Tset_size(t, size == 0 ? 1 : size));
  H5DDP_CHECK_H5(H5Tset_strpad(t, H5T_STR_NULLPAD));
  return t;
}

Handle make_space(const std::vector<int64_t>& shape) {
  if (shape.empty()) return dataspace(H5Screate(H5S_SCALAR));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return dataspace(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
}

std::vector<int64_t> space_shape(hid_t space) {
  int rank = H5Sget_simple_extent_ndims(space);
  H5DDP_CHECK_H5(rank);
  std::vector<hsize_t> dims(rank);
  if (rank > 0) H5DDP_CHECK_H5(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  return std::vector<int64_t>(dims.begin(), dims.end());
}

namespace {
void write_attr_raw(hid_t loc, const std::string& name, hid_t type, const void* value) {
  Handle space = dataspace(H5Screate(H5S_SCALAR));
  Handle a = attribute(H5Acreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT));
  H5DDP_CHECK_H5(H5Awrite(a, type, value));
}

Handle open_attr(hid_t loc, const std::string& name) {
  return with_context("reading attribute '" + name + "'", [&] {
    SilenceErrors quiet;
    return attribute(H5Aopen(loc, name.c_str(), H5P_DEFAULT));
  });
}

void read_attr_number(hid_t loc, const std::string& name, H5T_class_t cls, hid_t mem_type, void* out) {
  Handle a = open_attr(loc, name);
  Handle t = datatype(H5Aget_type(a));
  Handle s = dataspace(H5Aget_space(a));
  if (H5Tget_class(t) != cls || H5Sget_simple_extent_npoints(s) != 1)
    throw H5Error("attribute '" + name + "' has an unexpected type or shape");
  H5DDP_CHECK_H5(H5Aread(a, mem_type, out));
}
}  // namespace

void write_attr(hid_t loc, const std::string& name, const std::string& value) {
  Handle t = datatype(H5Tcopy(H5T_C_S1));
  H5DDP_CHECK_H5(H5Tset_size(t, H5T_VARIABLE));
  H5DDP_CHECK_H5(H5Tset_cset(t, H5T_CSET_UTF8));
  const char* p = value.c_str();
  write_attr_raw(loc, name, t, &p);
}
void write_attr(hid_t loc, const std::string& name, int64_t value) {
  write_attr_raw(loc, name, H5T_STD_I64LE, &value);
}
void write_attr(hid_t loc, const std::string& name, uint64_t value) {
  write_attr_raw(loc, name, H5T_STD_U64LE, &value);
}
void write_attr(hid_t loc, const std::string& name, double value) {
  write_attr_raw(loc, name, H5T_IEEE_F64LE, &value);
}

bool has_attr(hid_t loc, const std::string& name) {
  SilenceErrors quiet;
  return H5Aexists(loc, name.c_str()) > 0;
}

std::string read_attr_string(hid_t loc, const std::string& name) {
  Handle a = open_attr(loc, name);
  Handle t = datatype(H5Aget_type(a));
  if (H5Tget_class(t) != H5T_STRING) throw H5Error("attribute '" + name + "' is not a string");
  if (H5Tis_variable_str(t) > 0) {
    Handle mt = datatype(H5Tcopy(H5T_C_S1));
    H5DDP_CHECK_H5(H5Tset_size(mt, H5T_VARIABLE));
    H5DDP_CHECK_H5(H5Tset_cset(mt, H5Tget_cset(t)));
    char* p = nullptr;
    H5DDP_CHECK_H5(H5Aread(a, mt, &p));
    std::string out = p ? p : "";
    H5free_memory(p);
    return out;
  }
  size_t n = H5Tget_size(t);
  std::string buf(n, '\0');
  H5DDP_CHECK_H5(H5Aread(a, t, buf.data()));
  return buf.substr(0, buf.find('\0'));
}

int64_t read_attr_int(hid_t loc, const std::string& name) {
  int64_t v = 0;
  read_attr_number(loc, name, H5T_INTEGER, H5T_NATIVE_INT64, &v);
  return v;
}
uint64_t read_attr_uint(hid_t loc, const std::string& name) {
  uint64_t v = 0;
  read_attr_number(loc, name, H5T_INTEGER, H5T_NATIVE_UINT64, &v);
  return v;
}
double read_attr_double(hid_t loc, const std::string& name) {
  double v = 0;
  read_attr_number(loc, name, H5T_FLOAT, H5T_NATIVE_DOUBLE, &v);
  return v;
}

std::vector<std::string> attr_names(hid_t loc) {
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  H5DDP_CHECK_H5(H5Aiterate2(loc, H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &names));
  return names;
}

bool is_hdf5_file(const std::string& path) {
  SilenceErrors quiet;
  return H5Fis_hdf5(path.c_str()) > 0;
}

std::optional<uint64_t> stored_end_of_file(const std::string& path) {
  // The superblock sits at 0, 512, 1024, 2048, ... (a user block may precede it); its layout is in the HDF5
  // file format specification, section II.A. Addresses are little-endian, `size of offsets` bytes wide.
  static const unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  for (uint64_t at = 0; at < size; at = at == 0 ? 512 : at * 2) {
    unsigned char b[96] = {0};
    in.clear();
    in.seekg(static_cast<std::streamoff>(at));
    in.read(reinterpret_cast<char*>(b), sizeof b);
    const auto got = static_cast<size_t>(in.gcount());
    if (got < 8 || std::memcmp(b, kSignature, 8) != 0) continue;
    const unsigned version = b[8];
    size_t offsets_at = 0, addr_at = 0;  // where `size of offsets` is, where the base address starts
    if (version == 0)
      offsets_at = 13, addr_at = 24;
    else if (version == 1)
      offsets_at = 13, addr_at = 28;
    else if (version == 2 || version == 3)
      offsets_at = 9, addr_at = 12;
    else
      return std::nullopt;
    const unsigned width = b[offsets_at];
    if (width != 2 && width != 4 && width != 8) return std::nullopt;
    auto address = [&](size_t i) {  // i-th address after addr_at
      uint64_t v = 0;
      for (unsigned k = 0; k < width; ++k) v |= uint64_t(b[addr_at + i * width + k]) << (8 * k);
      return v;
    };
    if (addr_at + 3 * width > got) return std::nullopt;
    // v0/v1: base, free-space info, end of file; v2/v3: base, superblock extension, end of file.
    return address(0) + address(2);
  }
  return std::nullopt;
}

}  // namespace h5
}  // namespace h5ddp

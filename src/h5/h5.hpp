// Thin RAII layer over the HDF5 C API: move-only handles, the property lists h5ddp uses for MPI-IO,
// attribute helpers, and the bridge from the HDF5 error stack to h5ddp::H5Error. Nothing here is
// checkpoint-specific; the file layout lives in format.hpp and the checkpoint sources.
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "h5ddp/dtype.hpp"

namespace h5ddp::h5 {

// Owns one hid_t and closes it with the matching H5?close. Destructors log close failures, never throw;
// close() throws (use it for files, where a failed close means lost data).
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle();
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: handles are passed straight to the C API
  bool valid() const { return id_ >= 0; }
  // Closes now; throws H5Error on failure. No-op on an invalid handle.
  void close();
  // Gives up ownership without closing.
  hid_t release();

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Each checks the id and throws H5Error (with the HDF5 error stack) when it is negative.
Handle file(hid_t id);
Handle group(hid_t id);
Handle dataset(hid_t id);
Handle dataspace(hid_t id);
Handle datatype(hid_t id);
Handle attribute(hid_t id);
Handle plist(hid_t id);

// While alive, HDF5 prints nothing on errors (we read the stack ourselves); restores the old handler.
class SilenceErrors {
 public:
  SilenceErrors();
  ~SilenceErrors();
  SilenceErrors(const SilenceErrors&) = delete;
  SilenceErrors& operator=(const SilenceErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// The current HDF5 error stack as "major: minor (function)" lines, innermost last; clears it.
std::string error_stack_text();
// The innermost entry of the current HDF5 error stack ("minor: description", e.g. "truncated file: eof = ...");
// "" when the stack is empty. Leaves the stack as it is.
std::string innermost_error_text();

// ---- property lists ----
struct MpioOptions {
  hsize_t alignment = 1 << 20;            // objects >= alignment_threshold start on a multiple of this
  hsize_t alignment_threshold = 1 << 20;  // 0 (with alignment 0): no alignment
  // MPI_Info hints set after h5ddp's own (so they override them).
  std::vector<std::pair<std::string, std::string>> hints;
};
// Empty, or why HDF5 calls in this process do not all reach one library: Debian's LibTorch links the serial
// HDF5, so a process with LibTorch holds two libraries defining the same symbols, and each call binds to
// whichever comes first. mpio_file_access refuses to open files with a mixed binding.
std::string hdf5_library_conflict();
// File access for MPI-IO on `comm` with collective metadata reads and writes, libver bounds
// [earliest, v18] and the MPI_Info hints h5ddp uses. Not collective by itself.
Handle mpio_file_access(MPI_Comm comm, const MpioOptions& options = {});
// File access for one process (sec2 driver), libver bounds as above.
Handle serial_file_access();
// For opening an existing file read-only: its superblock may be of any version HDF5 reads (2 or 3, e.g. an
// `h5repack -L` copy; the bounds above would refuse it with "superblock version exceeds high bound").
void read_any_format_version(hid_t fapl);
// Dataset transfer list: collective or independent MPI-IO.
Handle transfer(bool collective);

// ---- objects ----
// True if `path` (absolute, may be nested) names a link that exists; false for any missing component.
bool exists(hid_t loc, const std::string& path);
// Names of the links in group `path`, in name order.
std::vector<std::string> children(hid_t loc, const std::string& path);
// Creates group `path` (intermediate groups too when they are missing).
Handle create_group(hid_t loc, const std::string& path);
// HDF5 type of a DType in the file (see docs/FORMAT.md): IEEE half for float16, u16 for bfloat16, u8 for bool.
Handle file_type(DType dtype);
// Memory type matching file_type on this (little-endian) host.
Handle memory_type(DType dtype);
// A fixed-length NUL-padded string type of `size` bytes.
Handle fixed_string_type(size_t size);
// Simple dataspace of `shape`, or a scalar dataspace for an empty shape.
Handle make_space(const std::vector<int64_t>& shape);
// Shape of a dataspace (empty for scalar).
std::vector<int64_t> space_shape(hid_t space);

// ---- attributes (on any object; `loc` is a file, group or dataset) ----
void write_attr(hid_t loc, const std::string& name, const std::string& value);
void write_attr(hid_t loc, const std::string& name, int64_t value);
void write_attr(hid_t loc, const std::string& name, uint64_t value);
void write_attr(hid_t loc, const std::string& name, double value);
bool has_attr(hid_t loc, const std::string& name);
// Readers throw H5Error when the attribute is missing or has the wrong class.
std::string read_attr_string(hid_t loc, const std::string& name);
int64_t read_attr_int(hid_t loc, const std::string& name);
uint64_t read_attr_uint(hid_t loc, const std::string& name);
double read_attr_double(hid_t loc, const std::string& name);
// Names of all attributes of `loc`, in name order.
std::vector<std::string> attr_names(hid_t loc);

// True when `path` exists and starts with the HDF5 signature (H5Fis_hdf5 without its error noise).
bool is_hdf5_file(const std::string& path);

// Where the file's HDF5 superblock says its data ends (base address + end-of-file address, in bytes), read
// from the superblock (versions 0-3) without opening the file through HDF5; std::nullopt when there is no
// readable superblock. A file shorter than this was cut short (a copy or write that did not finish).
std::optional<uint64_t> stored_end_of_file(const std::string& path);

}  // namespace h5ddp::h5

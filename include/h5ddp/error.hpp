// Typed exceptions and check macros. Every message names the host and rank it was raised on, and
// callers may add context ("while writing /model/fc1.weight to ckpt-00000200.h5") as it unwinds.
// Includes no MPI, HDF5, CUDA or LibTorch header: the macros forward an int to out-of-line functions.
#pragma once

#include <stdexcept>
#include <string>

namespace h5ddp {

// Base of every exception h5ddp throws. The message starts with "[host rank r/N]".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message);
  // For a message that already names where it came from (one rank's error re-raised on every rank):
  // no "[host rank r/N]" of this process is added.
  struct Untagged {};
  Error(Untagged, const std::string& message);
  const char* what() const noexcept override { return message_.c_str(); }
  // Appends "\n  while <context>" to the message; used by callers that rethrow with `throw;`.
  void add_context(const std::string& context);
  // True when every rank of the communicator raised this error together, after agreeing on it
  // (Comm::raise_if_any, the checkpoint layer's agreement): every rank knows it, so a tool may print it
  // once and leave through MPI_Finalize instead of ending the job with MPI_Abort.
  bool agreed() const noexcept { return agreed_; }
  void mark_agreed() noexcept { agreed_ = true; }

 private:
  std::string message_;
  bool agreed_ = false;
};

class MpiError : public Error {
  using Error::Error;
};  // an MPI call failed
class H5Error : public Error {
  using Error::Error;
};  // an HDF5 call failed (message has the error stack)
class CudaError : public Error {
  using Error::Error;
};  // a CUDA runtime call failed
class NcclError : public Error {
  using Error::Error;
};  // an NCCL call failed
class ConfigError : public Error {
  using Error::Error;
};  // bad option or configuration
class DisagreementError : public Error {
  using Error::Error;
};  // ranks disagreed before a collective
// A checkpoint is invalid or cannot be written. file(): the checkpoint it is about, where the raiser knows it
// (a resume sets it on every rank to the file it refused), so callers never search the message for a path.
class CheckpointError : public Error {
 public:
  using Error::Error;
  const std::string& file() const noexcept { return file_; }
  void set_file(const std::string& file) { file_ = file; }

 private:
  std::string file_;
};
// A readable checkpoint of another model or optimizer than the one to load into (missing or extra keys,
// shapes, dtypes): resuming must not fall back to an older file, which would not match either.
class CheckpointMismatchError : public CheckpointError {
  using CheckpointError::CheckpointError;
};
class DataError : public Error {
  using Error::Error;
};  // a data set file is missing or malformed

// "[host rank r/N]" once MpiEnv has started, "[host]" before.
std::string process_tag();

namespace detail {
void set_process_identity(const std::string& host, int rank, int size);
[[noreturn]] void throw_mpi_error(int code, const char* expr, const char* file, int line);
[[noreturn]] void throw_h5_error(const char* expr, const char* file, int line);              // defined in h5ddp_io
[[noreturn]] void throw_cuda_error(int code, const char* expr, const char* file, int line);  // CUDA builds
[[noreturn]] void throw_nccl_error(int code, const char* expr, const char* file, int line);  // CUDA builds
[[noreturn]] void throw_check_failed(const char* expr, const std::string& message, const char* file, int line);
std::string source_location(const char* file, int line);  // " (file.cpp:123)", the file without its directories
}  // namespace detail

// Throws `e` marked agreed (Error::agreed): for an error that every rank raises together because a
// collective decided it (the same verdict on every rank).
template <class E>
[[noreturn]] void throw_agreed(E e) {
  e.mark_agreed();
  throw e;
}

// Runs f(); if it throws an h5ddp::Error, appends `context` and rethrows the same exception.
template <class F>
auto with_context(const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (Error& e) {
    e.add_context(context);
    throw;
  }
}

}  // namespace h5ddp

#define H5DDP_CHECK_MPI(expr)                                                                   \
  do {                                                                                          \
    const int h5ddp_rc_ = (expr);                                                               \
    if (h5ddp_rc_ != 0) ::h5ddp::detail::throw_mpi_error(h5ddp_rc_, #expr, __FILE__, __LINE__); \
  } while (0)

// For HDF5 calls returning herr_t or hid_t: negative means failure.
#define H5DDP_CHECK_H5(expr)                                                    \
  do {                                                                          \
    if ((expr) < 0) ::h5ddp::detail::throw_h5_error(#expr, __FILE__, __LINE__); \
  } while (0)

#define H5DDP_CHECK_CUDA(expr)                                                                   \
  do {                                                                                           \
    const int h5ddp_rc_ = static_cast<int>(expr);                                                \
    if (h5ddp_rc_ != 0) ::h5ddp::detail::throw_cuda_error(h5ddp_rc_, #expr, __FILE__, __LINE__); \
  } while (0)

#define H5DDP_CHECK_NCCL(expr)                                                                   \
  do {                                                                                           \
    const int h5ddp_rc_ = static_cast<int>(expr);                                                \
    if (h5ddp_rc_ != 0) ::h5ddp::detail::throw_nccl_error(h5ddp_rc_, #expr, __FILE__, __LINE__); \
  } while (0)

// General invariant check with a message built only on failure: H5DDP_CHECK(n > 0, "n=" + std::to_string(n)).
#define H5DDP_CHECK(cond, message)                                                          \
  do {                                                                                      \
    if (!(cond)) ::h5ddp::detail::throw_check_failed(#cond, (message), __FILE__, __LINE__); \
  } while (0)

// The communication interface every higher layer talks to (ddp, checkpoint, trainer). It moves raw
// buffers described by (pointer, count, DType) so it needs neither LibTorch nor HDF5. Backends:
// MpiComm (host memory) and NcclComm (device memory, CUDA builds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "h5ddp/dtype.hpp"

namespace h5ddp {

enum class ReduceOp : uint8_t { kSum, kMin, kMax };

// Handle of an asynchronous operation. wait() rethrows the operation's error, if any.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // Non-blocking completion check; also drives progress for backends that need it.
  virtual bool test() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // All of the following are collective over this communicator.
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // Starts an allreduce in place and returns at once; `buf` must stay valid until wait() returns.
  // Ranks must start asynchronous operations in the same order.
  virtual std::unique_ptr<Work> allreduce_async(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // recv holds size() * count elements, rank r's contribution at offset r * count.
  virtual void allgather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // In place over segments: `buf` holds counts[0] + ... + counts[size()-1] elements, rank r's segment starting
  // at counts[0] + ... + counts[r-1]. reduce_scatter_async starts the reduction of every segment over all ranks
  // and returns at once; on completion this rank's segment holds the reduction of its segment, the others hold
  // unspecified values (`buf` valid until wait() returns; the ordering rule of allreduce_async applies).
  // Default: an in-place allreduce of the whole buffer (correct, twice the traffic); MpiComm overrides it.
  virtual std::unique_ptr<Work> reduce_scatter_async(void* buf, const std::vector<size_t>& counts, DType dtype,
                                                     ReduceOp op);
  // Every rank's segment of `buf` (as above) copied to all ranks. Default: one broadcast per rank.
  virtual void allgatherv(void* buf, const std::vector<size_t>& counts, DType dtype);
  // allgatherv started in place; returns at once (`buf` valid until wait() returns; the ordering rule of
  // allreduce_async applies, among all the asynchronous operations). Default: the blocking allgatherv, then a
  // completed Work. MpiComm and NcclComm override it.
  virtual std::unique_ptr<Work> allgatherv_async(void* buf, const std::vector<size_t>& counts, DType dtype);
  virtual void barrier() = 0;

  // Collective. True on every rank iff every rank passed the same value (one allreduce).
  bool agree(uint64_t value);
  // Collective. True on every rank iff `local_ok` is true on every rank.
  bool all_ok(bool local_ok);
  // Collective. If any rank passes a non-empty `local_error`, every rank throws DisagreementError
  // carrying the lowest such rank's number and message (so no rank goes on into a collective alone).
  void raise_if_any(const std::string& local_error);
  // Collective. Throws DisagreementError on all ranks unless all ranks passed the same value;
  // `what` names the quantity ("checkpoint step") and the message lists the values seen.
  void require_same(int64_t value, const std::string& what);
  // Collective. Broadcasts a string from root.
  std::string broadcast_string(const std::string& s, int root);
  // Collective. Nothing when `error` is null on every rank; otherwise every rank throws, marked agreed, the
  // exception of the lowest rank whose `error` is set: its h5ddp::Error type (ConfigError, DataError,
  // CheckpointError, ...; any other exception as Error) and its message, which names that rank. agreed() below
  // is the usual way in.
  void rethrow_first(const std::exception_ptr& error);
};

// Collective. "Agree, then throw" in one place: runs f() on every rank; if it throws on any rank, every rank
// throws the lowest failing rank's error (Comm::rethrow_first), so no rank goes on into a collective alone.
// Returns f()'s value on success. f() itself must not be collective unless every rank reaches its end.
template <class F>
auto agreed(Comm& comm, F&& f) -> decltype(f()) {
  using Result = decltype(f());
  std::exception_ptr error;
  if constexpr (std::is_void_v<Result>) {
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
    comm.rethrow_first(error);
  } else {
    std::optional<Result> result;
    try {
      result.emplace(f());
    } catch (...) {
      error = std::current_exception();
    }
    comm.rethrow_first(error);
    return std::move(*result);
  }
}

}  // namespace h5ddp

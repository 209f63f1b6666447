// Comm over MPI for host memory. Owns a duplicate of its parent communicator (never MPI_COMM_WORLD
// itself), set to MPI_ERRORS_RETURN so failures throw MpiError. Asynchronous allreduces run on a second
// duplicate, so they never interleave with the blocking collectives of the calling thread.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>

#include "h5ddp/comm.hpp"

namespace h5ddp {

MPI_Datatype mpi_datatype(DType t);
MPI_Op mpi_op(ReduceOp op);

class MpiComm final : public Comm {
 public:
  // How allreduce_async makes progress. Open MPI advances non-blocking collectives only inside MPI calls,
  // so kNonBlocking (MPI_Iallreduce) progresses only when the caller tests or waits. kThread hands the
  // operation to a worker thread that runs a blocking MPI_Allreduce; kProgress starts MPI_Iallreduce on
  // the caller's thread and a worker thread tests it every H5DDP_MPI_POLL_US (default 50) microseconds.
  // Both advance while the caller computes and need MPI_THREAD_MULTIPLE. docs/DEFAULTS.md and
  // docs/BENCHMARKS.md (DDP) compare kThread and kProgress (kNonBlocking's measurements are in the git history
  // of docs/BENCHMARKS.md).
  enum class AsyncMode { kNonBlocking, kThread, kProgress };
  // H5DDP_MPI_ASYNC=thread|progress|nonblocking; else kNonBlocking without MPI_THREAD_MULTIPLE; else
  // kProgress when this node has at least one core per rank but fewer than two (a worker spinning in a
  // blocking MPI_Allreduce would take the core its rank's backward runs on), kThread otherwise: with a
  // spare core per rank, or more ranks than cores (Open MPI then yields while it waits). Open MPI's
  // MPI_Iallreduce of large buckets was 9-14x slower than its blocking MPI_Allreduce here (docs/BENCHMARKS.md,
  // "Large MLP (measured under load)", in its git history).
  // dup() uses rank 0's choice on every rank: blocking and non-blocking collectives do not match.
  static AsyncMode default_async_mode(int ranks_on_node, unsigned cores);

  // Collective over `parent`: duplicates it (twice: blocking and async traffic) and owns the duplicates.
  static std::unique_ptr<MpiComm> dup(MPI_Comm parent);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }

  void broadcast(void* buf, size_t count, DType dtype, int root) override;
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  // MPI_Iallreduce on the async communicator; Work::test() calls MPI_Test to drive progress.
  // In kThread/kProgress modes this communicator's worker thread completes the operation.
  std::unique_ptr<Work> allreduce_async(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void allgather(const void* send, void* recv, size_t count, DType dtype) override;
  // One in-place reduce per rank's segment to that rank, in chunks of the allreduce chunk size (MPI_Ireduce, or
  // blocking MPI_Reduce on the worker in kThread mode): each sum lands in its owner's segment, and no call
  // allocates more than a chunk (one MPI_Reduce_scatter allocated the whole buffer's size again; ZeRO-2).
  std::unique_ptr<Work> reduce_scatter_async(void* buf, const std::vector<size_t>& counts, DType dtype,
                                             ReduceOp op) override;
  void allgatherv(void* buf, const std::vector<size_t>& counts, DType dtype) override;
  // MPI_Iallgatherv in place on the async communicator (kNonBlocking, kProgress: the worker tests it), or a blocking
  // MPI_Allgatherv on the worker thread (kThread), as allreduce_async.
  std::unique_ptr<Work> allgatherv_async(void* buf, const std::vector<size_t>& counts, DType dtype) override;
  void barrier() override;

  // Local, but every rank must choose the same mode, and only while no asynchronous operation is in flight.
  void set_async_mode(AsyncMode mode);
  AsyncMode async_mode() const { return async_mode_; }
  std::string async_mode_name() const {
    return async_mode_ == AsyncMode::kThread     ? "thread"
           : async_mode_ == AsyncMode::kProgress ? "progress"
                                                 : "nonblocking";
  }
  // Whether waiting for an asynchronous allreduce sleeps between tests (more ranks on this node than cores,
  // or H5DDP_MPI_WAIT=sleep) instead of spinning (H5DDP_MPI_WAIT=spin).
  bool sleeps_while_waiting() const { return sleep_while_waiting_; }

 private:
  class Worker;
  MpiComm();
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm async_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  AsyncMode async_mode_ = AsyncMode::kNonBlocking;
  bool sleep_while_waiting_ = false;
  std::chrono::microseconds poll_interval_{50};  // H5DDP_MPI_POLL_US, read once
  size_t reduce_chunk_bytes_ = size_t{4} << 20;  // bytes per MPI allreduce call: rank 0's, agreed in dup()
  std::unique_ptr<Worker> worker_;               // started on the first kThread/kProgress operation
};

}  // namespace h5ddp

// Comm over NCCL for CUDA device buffers (CUDA builds: -DH5DDP_WITH_CUDA=ON). In CPU builds this header
// declares nothing, so code may include it unconditionally and test H5DDP_WITH_CUDA.
//
// Stream semantics (as c10d's ProcessGroupNCCL and llm.c): NCCL work runs on this communicator's own stream,
// which first waits on a CUDA event recorded on the caller's stream (no host synchronisation). Blocking
// calls return once the result is ordered before later work on the caller's stream; a Work's wait() makes
// the caller's stream wait for it. Host buffers are accepted too (staged through device memory with a host
// synchronisation) so Comm's host helpers (agree, raise_if_any, ...) still work, slowly.
#pragma once

#if defined(H5DDP_WITH_CUDA)

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "h5ddp/comm.hpp"

namespace h5ddp {

class NcclComm final : public Comm {
 public:
  // Collective over `bootstrap` (an MpiComm: the ncclUniqueId travels by MPI_Bcast from its rank 0). Uses
  // the current CUDA device of each rank (MpiEnv::select_cuda_device() picks local_rank % devices).
  static std::unique_ptr<NcclComm> create(Comm& bootstrap);
  // Not collective: waits for this communicator's stream, then destroys the NCCL communicator. Never throws.
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  ncclComm_t handle() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

  // The stream whose work the collectives are ordered after (default: the legacy default stream, which
  // is LibTorch's default). Local.
  void set_caller_stream(cudaStream_t s) { caller_stream_ = s; }

  void broadcast(void* buf, size_t count, DType dtype, int root) override;
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  std::unique_ptr<Work> allreduce_async(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void allgather(const void* send, void* recv, size_t count, DType dtype) override;
  // In place: one ncclAllGather when every rank's segment has the same size, else one ncclBroadcast per non-empty
  // segment (its rank the root) in one NCCL group. The asynchronous form needs a device buffer.
  void allgatherv(void* buf, const std::vector<size_t>& counts, DType dtype) override;
  std::unique_ptr<Work> allgatherv_async(void* buf, const std::vector<size_t>& counts, DType dtype) override;
  void barrier() override;

  // Collective: operations started between group_start() and group_end() (asynchronous allreduces, e.g.
  // the buckets of one step) are issued as one NCCL group; their Works complete after group_end().
  void group_start();
  void group_end();

 private:
  struct Pending;
  NcclComm() = default;
  void begin_op();                  // nccl stream waits on an event recorded on the caller stream
  cudaEvent_t end_op();             // event recorded on the nccl stream after the op (owned by caller)
  void join_caller(cudaEvent_t e);  // caller stream waits on e
  void check_async_error();
  void issue_allgatherv(void* dev, const std::vector<size_t>& counts, DType dtype);  // on stream_, after begin_op
  std::unique_ptr<Work> pending_work();  // a Work for the operations just issued on stream_ (or at group_end)

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t caller_stream_ = cudaStreamLegacy;
  cudaEvent_t ready_event_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  int group_depth_ = 0;
  std::vector<std::shared_ptr<Pending>> grouped_;  // Works waiting for group_end()
};

}  // namespace h5ddp

#endif  // H5DDP_WITH_CUDA

#include "h5ddp/nccl_comm.hpp"

#include <algorithm>
#include <exception>
#include <string>

#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"

namespace h5ddp {
namespace {

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI64:
      return ncclInt64;
    case DType::kI32:
      return ncclInt32;
    case DType::kI8:
      return ncclInt8;
    case DType::kU8:
    case DType::kBool:
      return ncclUint8;
    case DType::kU64:
      return ncclUint64;
    case DType::kI16:
      break;
  }
  throw ConfigError(std::string("NCCL has no datatype for ") + dtype_name(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  throw ConfigError("unknown reduce op");
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // plain host memory on old runtimes: clear the sticky error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// Device copy of a host buffer for the blocking calls, copied back (after a stream sync) on finish().
class Staged {
 public:
  Staged(void* host, size_t bytes, cudaStream_t stream, bool copy_in) : host_(host), bytes_(bytes), stream_(stream) {
    if (is_device_pointer(host)) {
      dev_ = host;
      return;
    }
    H5DDP_CHECK_CUDA(cudaMalloc(&dev_, bytes_ ? bytes_ : 1));
    owned_ = true;
    if (copy_in && bytes_) H5DDP_CHECK_CUDA(cudaMemcpy(dev_, host_, bytes_, cudaMemcpyHostToDevice));
  }
  ~Staged() {
    if (owned_) cudaFree(dev_);
  }
  void* dev() const { return dev_; }
  void finish() {
    if (!owned_) return;
    H5DDP_CHECK_CUDA(cudaStreamSynchronize(stream_));
    if (bytes_) H5DDP_CHECK_CUDA(cudaMemcpy(host_, dev_, bytes_, cudaMemcpyDeviceToHost));
  }

 private:
  void* host_;
  size_t bytes_;
  cudaStream_t stream_;
  void* dev_ = nullptr;
  bool owned_ = false;
};

}  // namespace

struct NcclComm::Pending {
  cudaEvent_t done = nullptr;
  bool recorded = false;
  ~Pending() {
    if (done) cudaEventDestroy(done);  // legal while the recorded work is still pending
  }
};

namespace {
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<void> pending, cudaEvent_t* done, bool* recorded, cudaStream_t caller, ncclComm_t comm)
      : pending_(std::move(pending)), done_(done), recorded_(recorded), caller_(caller), comm_(comm) {}
  void wait() override {
    H5DDP_CHECK(*recorded_, "NcclComm: Work::wait() inside an unfinished group_start()/group_end()");
    H5DDP_CHECK_CUDA(cudaStreamWaitEvent(caller_, *done_, 0));  // ordered on the GPU, no host sync
    ncclResult_t async_err = ncclSuccess;
    H5DDP_CHECK_NCCL(ncclCommGetAsyncError(comm_, &async_err));
    H5DDP_CHECK_NCCL(async_err);
  }
  bool test() override {
    if (!*recorded_) return false;
    const cudaError_t e = cudaEventQuery(*done_);
    if (e == cudaErrorNotReady) return false;
    H5DDP_CHECK_CUDA(e);
    return true;
  }

 private:
  std::shared_ptr<void> pending_;  // keeps the event alive
  cudaEvent_t* done_;
  bool* recorded_;
  cudaStream_t caller_;
  ncclComm_t comm_;
};
}  // namespace

std::unique_ptr<NcclComm> NcclComm::create(Comm& bootstrap) {
  std::unique_ptr<NcclComm> c(new NcclComm());
  c->rank_ = bootstrap.rank();
  c->size_ = bootstrap.size();
  // Every step that can fail on one rank is agreed on before the next collective, so no rank waits alone.
  std::string err;
  ncclUniqueId id{};
  try {
    H5DDP_CHECK_CUDA(cudaGetDevice(&c->device_));
    if (c->rank_ == 0) H5DDP_CHECK_NCCL(ncclGetUniqueId(&id));
  } catch (const std::exception& e) {
    err = e.what();
  }
  bootstrap.raise_if_any(err);
  bootstrap.broadcast(&id, sizeof(id), DType::kU8, 0);  // MPI_Bcast on an MpiComm
  try {
    H5DDP_CHECK_CUDA(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking));
    H5DDP_CHECK_CUDA(cudaEventCreateWithFlags(&c->ready_event_, cudaEventDisableTiming));
  } catch (const std::exception& e) {
    err = e.what();
  }
  bootstrap.raise_if_any(err);
  H5DDP_CHECK_NCCL(ncclCommInitRank(&c->comm_, c->size_, id, c->rank_));  // collective inside NCCL
  return c;
}

NcclComm::~NcclComm() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (comm_) {
    ncclResult_t async_err = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async_err);
    if (async_err != ncclSuccess) {
      log::warn(std::string("NcclComm: aborting communicator after an asynchronous error: ") +
                ncclGetErrorString(async_err));
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
  }
  if (ready_event_) cudaEventDestroy(ready_event_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclComm::begin_op() {
  H5DDP_CHECK_CUDA(cudaEventRecord(ready_event_, caller_stream_));
  H5DDP_CHECK_CUDA(cudaStreamWaitEvent(stream_, ready_event_, 0));
}

cudaEvent_t NcclComm::end_op() {
  cudaEvent_t e = nullptr;
  H5DDP_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  H5DDP_CHECK_CUDA(cudaEventRecord(e, stream_));
  return e;
}

void NcclComm::join_caller(cudaEvent_t e) {
  const cudaError_t wait = cudaStreamWaitEvent(caller_stream_, e, 0);
  cudaEventDestroy(e);
  H5DDP_CHECK_CUDA(wait);
}

void NcclComm::check_async_error() {
  ncclResult_t async_err = ncclSuccess;
  H5DDP_CHECK_NCCL(ncclCommGetAsyncError(comm_, &async_err));
  H5DDP_CHECK_NCCL(async_err);
}

void NcclComm::broadcast(void* buf, size_t count, DType dtype, int root) {
  H5DDP_CHECK(group_depth_ == 0, "NcclComm: blocking broadcast inside a group");
  Staged s(buf, count * dtype_size(dtype), stream_, /*copy_in=*/rank_ == root);
  begin_op();
  H5DDP_CHECK_NCCL(ncclBroadcast(s.dev(), s.dev(), count, nccl_dtype(dtype), root, comm_, stream_));
  join_caller(end_op());
  s.finish();
  check_async_error();
}

void NcclComm::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  H5DDP_CHECK(group_depth_ == 0, "NcclComm: blocking allreduce inside a group");
  Staged s(buf, count * dtype_size(dtype), stream_, true);
  begin_op();
  H5DDP_CHECK_NCCL(ncclAllReduce(s.dev(), s.dev(), count, nccl_dtype(dtype), nccl_op(op), comm_, stream_));
  join_caller(end_op());
  s.finish();
  check_async_error();
}

std::unique_ptr<Work> NcclComm::pending_work() {
  auto p = std::make_shared<Pending>();
  H5DDP_CHECK_CUDA(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
  if (group_depth_ > 0) {
    grouped_.push_back(p);  // the kernels are issued at ncclGroupEnd: record the event then
  } else {
    H5DDP_CHECK_CUDA(cudaEventRecord(p->done, stream_));
    p->recorded = true;
  }
  return std::make_unique<NcclWork>(p, &p->done, &p->recorded, caller_stream_, comm_);
}

std::unique_ptr<Work> NcclComm::allreduce_async(void* buf, size_t count, DType dtype, ReduceOp op) {
  H5DDP_CHECK(is_device_pointer(buf), "NcclComm::allreduce_async needs a device buffer");
  begin_op();
  H5DDP_CHECK_NCCL(ncclAllReduce(buf, buf, count, nccl_dtype(dtype), nccl_op(op), comm_, stream_));
  return pending_work();
}

void NcclComm::issue_allgatherv(void* dev, const std::vector<size_t>& counts, DType dtype) {
  H5DDP_CHECK(counts.size() == static_cast<size_t>(size_), "allgatherv: counts must have one entry per rank");
  const size_t es = dtype_size(dtype);
  const ncclDataType_t type = nccl_dtype(dtype);
  auto* p = static_cast<char*>(dev);
  if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts.front(); })) {
    // In place as NCCL defines it: this rank's segment is where its contribution already lies.
    const size_t n = counts.front();
    if (n > 0) H5DDP_CHECK_NCCL(ncclAllGather(p + rank_ * n * es, p, n, type, comm_, stream_));
    return;
  }
  H5DDP_CHECK_NCCL(ncclGroupStart());
  std::exception_ptr error;
  try {
    size_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      char* at = p + offset * es;
      if (counts[r] > 0) H5DDP_CHECK_NCCL(ncclBroadcast(at, at, counts[r], type, r, comm_, stream_));
      offset += counts[r];
    }
  } catch (...) {
    error = std::current_exception();
  }
  const ncclResult_t end = ncclGroupEnd();  // closed even after an error, so later groups are not nested in it
  if (error) std::rethrow_exception(error);
  H5DDP_CHECK_NCCL(end);
}

void NcclComm::allgatherv(void* buf, const std::vector<size_t>& counts, DType dtype) {
  H5DDP_CHECK(group_depth_ == 0, "NcclComm: blocking allgatherv inside a group");
  size_t total = 0;
  for (size_t c : counts) total += c;
  Staged s(buf, total * dtype_size(dtype), stream_, /*copy_in=*/true);
  begin_op();
  issue_allgatherv(s.dev(), counts, dtype);
  join_caller(end_op());
  s.finish();
  check_async_error();
}

std::unique_ptr<Work> NcclComm::allgatherv_async(void* buf, const std::vector<size_t>& counts, DType dtype) {
  H5DDP_CHECK(is_device_pointer(buf), "NcclComm::allgatherv_async needs a device buffer");
  begin_op();
  issue_allgatherv(buf, counts, dtype);
  return pending_work();
}

void NcclComm::allgather(const void* send, void* recv, size_t count, DType dtype) {
  H5DDP_CHECK(group_depth_ == 0, "NcclComm: blocking allgather inside a group");
  const size_t bytes = count * dtype_size(dtype);
  Staged in(const_cast<void*>(send), bytes, stream_, true);
  Staged out(recv, bytes * size_, stream_, false);
  begin_op();
  H5DDP_CHECK_NCCL(ncclAllGather(in.dev(), out.dev(), count, nccl_dtype(dtype), comm_, stream_));
  join_caller(end_op());
  out.finish();
  check_async_error();
}

void NcclComm::barrier() {
  int32_t v = 0;  // host value: staged, and finish() synchronises the stream, so this is a host barrier
  allreduce(&v, 1, DType::kI32, ReduceOp::kSum);
}

void NcclComm::group_start() {
  H5DDP_CHECK_NCCL(ncclGroupStart());
  ++group_depth_;
}

void NcclComm::group_end() {
  H5DDP_CHECK(group_depth_ > 0, "NcclComm: group_end() without group_start()");
  --group_depth_;
  H5DDP_CHECK_NCCL(ncclGroupEnd());
  if (group_depth_ > 0) return;
  for (auto& p : grouped_) {
    H5DDP_CHECK_CUDA(cudaEventRecord(p->done, stream_));
    p->recorded = true;
  }
  grouped_.clear();
}

}  // namespace h5ddp

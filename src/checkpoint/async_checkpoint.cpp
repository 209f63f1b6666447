#include "checkpoint/async_checkpoint.hpp"

#include <mpi.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "checkpoint/errors.hpp"
#include "h5ddp/clock.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/mpi_comm.hpp"

#ifdef H5DDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace h5ddp {
namespace {

constexpr size_t kAlign = 64;                     // each tensor starts on a cache line,
constexpr size_t kPage = 4096;                    // a large one on a page: its O_DIRECT writes need no bounce
constexpr size_t kPageAlignBytes = 64u << 10;     // (the file starts datasets of 1 MiB and more on 1 MiB)
constexpr size_t kParallelCopyBytes = 64u << 20;  // below this, one thread copies
constexpr size_t kCopyChunk = 16u << 20;          // unit of work of the copy threads

// The background save runs at a lower CPU priority than training (Linux nice is per thread, and the
// checksum thread it starts inherits it), so where cores are short the training threads win them and the
// save takes the slack. H5DDP_ASYNC_NICE=N sets the increment (default 10; 0 keeps the caller's priority).
void lower_this_thread_priority() {
  const char* e = std::getenv("H5DDP_ASYNC_NICE");
  const int inc = e ? std::atoi(e) : 10;
  if (inc <= 0) return;
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0 && ::setpriority(PRIO_PROCESS, tid, std::min(19, current + inc)) != 0)
    log::debug(std::string("asynchronous checkpoint: cannot lower the writer's priority: ") + std::strerror(errno));
}

size_t align_up(size_t n, size_t to = kAlign) {
  return (n + to - 1) / to * to;
}
// Where a tensor of n bytes may start in the arena (an offset from its page-aligned base).
size_t place(size_t offset, size_t n) {
  return align_up(offset, n >= kPageAlignBytes ? kPage : kAlign);
}

// Copies n bytes; in CUDA builds `src` may be device memory (unified addressing tells which).
void copy_bytes(void* dst, const void* src, size_t n) {
#ifdef H5DDP_WITH_CUDA
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, src) == cudaSuccess && attr.type == cudaMemoryTypeDevice) {
    H5DDP_CHECK_CUDA(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
    return;
  }
  cudaGetLastError();  // clear the error a plain host pointer may leave
#endif
  std::memcpy(dst, src, n);
}

struct Copy {
  void* dst;
  const void* src;
  size_t n;
};

// Runs the copies, on up to 4 threads when `parallel` (the state is large).
void run_copies(const std::vector<Copy>& copies, bool parallel) {
  unsigned threads = parallel ? std::max(1u, std::min(4u, std::thread::hardware_concurrency())) : 1u;
  if (threads <= 1) {
    for (const Copy& c : copies) copy_bytes(c.dst, c.src, c.n);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::string> errors(threads);
  auto work = [&](unsigned id) {
    errors[id] = ckpt::capture_error([&] {
      for (size_t i = next++; i < copies.size(); i = next++) copy_bytes(copies[i].dst, copies[i].src, copies[i].n);
    });
  };
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) pool.emplace_back(work, i);
  work(0);
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (!e.empty()) throw CheckpointError("copying the state for an asynchronous save: " + e);
}

}  // namespace

// One host arena for every tensor of the snapshot, grown only when the state gets bigger. Pinned in CUDA
// builds so device-to-host copies run at full bandwidth.
struct AsyncCheckpointer::Buffers {
  void* data = nullptr;
  size_t capacity = 0;
  bool pinned = false;
  int allocations = 0;

  ~Buffers() { release(); }
  void release() {
    if (!data) return;
#ifdef H5DDP_WITH_CUDA
    if (pinned) {
      cudaFreeHost(data);
      data = nullptr;
      return;
    }
#endif
    std::free(data);
    data = nullptr;
  }
  void reserve(size_t bytes) {
    if (bytes <= capacity && data) return;
    release();
    capacity = 0;
    pinned = false;
#ifdef H5DDP_WITH_CUDA
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0 &&
        cudaHostAlloc(&data, bytes, cudaHostAllocDefault) == cudaSuccess)
      pinned = true;
    else
      cudaGetLastError();
#endif
    if (!data) data = std::aligned_alloc(kPage, align_up(std::max<size_t>(bytes, 1), kPage));
    if (!data) throw CheckpointError("cannot allocate " + std::to_string(bytes) + " bytes of checkpoint buffers");
    capacity = bytes;
    ++allocations;
  }
};

AsyncCheckpointer::AsyncCheckpointer(MpiComm& comm) : comm_(comm), buffers_(std::make_unique<Buffers>()) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  threaded_ = level >= MPI_THREAD_MULTIPLE;
  // Every rank must take the same path (the worker's collectives pair up across ranks).
  threaded_ = comm_.all_ok(threaded_);
  if (threaded_)
    bg_comm_ = MpiComm::dup(comm_.handle());
  else if (comm_.rank() == 0)
    log::warn("MPI_THREAD_MULTIPLE not granted: --async-checkpoint saves synchronously");
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (!worker_.joinable()) return;
  worker_.join();
  if (!worker_error_.empty()) log::error("asynchronous checkpoint save failed: " + worker_error_);
}

int AsyncCheckpointer::buffer_allocations() const {
  return buffers_->allocations;
}
size_t AsyncCheckpointer::buffer_bytes() const {
  return buffers_->capacity;
}

void AsyncCheckpointer::finish() {
  if (worker_.joinable()) worker_.join();
  std::string error = std::move(worker_error_);
  worker_error_.clear();
  try {
    comm_.rethrow_first(ckpt::checkpoint_error(error));
  } catch (Error& e) {
    e.add_context("asynchronous save of step " + std::to_string(snapshot_.counters.step) + " to " + run_dir_);
    throw;
  }
  if (!worker_result_.path.empty()) last_result_ = worker_result_;
  worker_result_ = SaveResult();
}

void AsyncCheckpointer::start(const TrainState& state, const std::string& run_dir, const SaveOptions& options) {
  const auto t0 = Clock::now();
  finish();  // at most one save in flight; a failure of the previous one surfaces here on all ranks
  timing_ = AsyncSaveTiming();
  timing_.wait_seconds = seconds_since(t0);

  const auto t1 = Clock::now();
  take_snapshot(state, run_dir, options);
  timing_.copy_seconds = seconds_since(t1);

  if (!threaded_) {
    last_result_ = save_checkpoint(comm_, snapshot_, run_dir_, options_);
    timing_.blocked_seconds = seconds_since(t0);
    return;
  }
  launch_worker();
  timing_.blocked_seconds = seconds_since(t0);
}

void AsyncCheckpointer::take_snapshot(const TrainState& state, const std::string& run_dir, const SaveOptions& options) {
  // Assigning into the same members reuses their capacity; tensor bytes go to the arena (copy_tensors).
  snapshot_.counters = state.counters;
  snapshot_.data = state.data;
  snapshot_.scheduler = state.scheduler;
  snapshot_.model = state.model;
  snapshot_.optimizer = state.optimizer;
  snapshot_.user = state.user;
  snapshot_.rng = state.rng;
  snapshot_.rng_by_rank.clear();
  snapshot_.saved_world_size = state.saved_world_size;
  snapshot_.meta = state.meta;
  run_dir_ = run_dir;
  options_ = options;
  copy_tensors();
}

void AsyncCheckpointer::copy_tensors() {
  std::vector<TensorRef*> refs;
  for (auto& t : snapshot_.model) refs.push_back(&t);
  for (auto& t : snapshot_.optimizer.state) refs.push_back(&t);
  for (auto& t : snapshot_.user) refs.push_back(&t);
  size_t total = 0;
  for (TensorRef* t : refs) total = place(total, t->nbytes()) + t->nbytes();
  buffers_->reserve(total);

  std::vector<Copy> copies;
  size_t offset = 0;
  auto* base = static_cast<char*>(buffers_->data);
  for (TensorRef* t : refs) {
    const size_t n = t->nbytes();
    H5DDP_CHECK(n == 0 || t->data != nullptr, "tensor " + t->name + " has no data");
    offset = place(offset, n);
    char* dst = base + offset;
    // Split big tensors so the copy threads share the work evenly.
    for (size_t done = 0; done < n; done += kCopyChunk)
      copies.push_back({dst + done, static_cast<const char*>(t->data) + done, std::min(kCopyChunk, n - done)});
    t->data = dst;
    offset += n;
  }
  timing_.bytes_copied = offset;
  run_copies(copies, offset >= kParallelCopyBytes);
}

void AsyncCheckpointer::launch_worker() {
  worker_error_.clear();
  worker_result_ = SaveResult();
  done_.store(false);
  worker_ = std::thread([this] {
    lower_this_thread_priority();
    worker_error_ =
        ckpt::capture_error([this] { worker_result_ = save_checkpoint(*bg_comm_, snapshot_, run_dir_, options_); });
    if (worker_error_.empty()) {
      log::debug("asynchronous checkpoint committed: " + worker_result_.path);
    }
    done_.store(true, std::memory_order_release);
  });
}

bool AsyncCheckpointer::poll() {
  const bool running_here = worker_.joinable() && !done_.load(std::memory_order_acquire);
  const bool failed_here = worker_.joinable() && !running_here && !worker_error_.empty();
  int64_t flags[2] = {failed_here ? 1 : 0, running_here ? 1 : 0};
  comm_.allreduce(flags, 2, DType::kI64, ReduceOp::kMax);
  if (flags[0]) finish();  // throws on every rank
  if (worker_.joinable() && flags[1] == 0) {
    // Finished without error on every rank: all ranks join in this same poll, so in_flight() stays
    // the same everywhere (callers may branch on it before a collective).
    worker_.join();
    if (!worker_result_.path.empty()) last_result_ = worker_result_;
    worker_result_ = SaveResult();
  }
  return flags[1] != 0;
}

SaveResult AsyncCheckpointer::wait() {
  finish();
  return last_result_;
}

}  // namespace h5ddp

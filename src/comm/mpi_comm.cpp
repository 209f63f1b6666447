#include "h5ddp/mpi_comm.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"

namespace h5ddp {
namespace {

// MPI counts are int: large buffers go in chunks of at most this many elements.
constexpr size_t kMaxChunk = static_cast<size_t>(INT_MAX) / 2;

// Bytes per MPI allreduce call. Open MPI's allreduce algorithms malloc a temporary buffer of the message's
// size on every call; above glibc's largest mmap threshold (32 MiB) that is a fresh mmap whose pages fault
// in every time. 214 MB of float32 at 2 ranks (docs/DEFAULTS.md): 0.6-1.2 s in 64 MiB calls, 0.07-0.10 s
// in 4 MiB calls; at 4 ranks 1.4-1.5 s against 0.22-0.30 s. H5DDP_MPI_REDUCE_CHUNK_BYTES overrides it
// (tests use a few bytes to cross chunk boundaries); rank 0's value is used everywhere (MpiComm::dup), since
// ranks that chunk differently would call different collectives.
size_t reduce_chunk_bytes_from_env() {
  const char* e = std::getenv("H5DDP_MPI_REDUCE_CHUNK_BYTES");
  const long long v = e ? std::atoll(e) : 0;
  return v > 0 ? static_cast<size_t>(v) : size_t{4} << 20;
}
size_t elements_per_call(size_t chunk_bytes, size_t element_size) {
  return std::clamp<size_t>(chunk_bytes / element_size, 1, kMaxChunk);
}

// Calls f(offset, n) for consecutive chunks of at most `per` of `count` elements (once, with n = 0, when
// count is 0: every rank still takes part in the collective).
template <class F>
void for_each_chunk(size_t count, size_t per, F&& f) {
  size_t off = 0;
  do {
    const size_t n = std::min(per, count - off);
    f(off, static_cast<int>(n));
    off += n;
  } while (off < count);
}

std::chrono::microseconds poll_interval() {
  const char* e = std::getenv("H5DDP_MPI_POLL_US");
  return std::chrono::microseconds(e ? std::max(0, std::atoi(e)) : 50);
}

// Tests `reqs` until they complete, sleeping `interval` between tests: MPI_Waitall busy-polls, and a rank
// spinning on a core that another rank needs delays the very collective it waits for.
void sleepy_waitall(std::vector<MPI_Request>& reqs, std::chrono::microseconds interval) {
  for (int flag = 0;;) {
    H5DDP_CHECK_MPI(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) return;
    std::this_thread::sleep_for(interval);
  }
}

class MpiWork final : public Work {
 public:
  // sleep_interval > 0: wait() tests and sleeps this long between tests instead of MPI_Waitall's spin.
  // on_done (may be empty) runs once, on the thread that sees the requests complete.
  MpiWork(std::vector<MPI_Request> reqs, std::chrono::microseconds sleep_interval, std::function<void()> on_done = {})
      : reqs_(std::move(reqs)), sleep_(sleep_interval), on_done_(std::move(on_done)) {}
  ~MpiWork() override {
    // A Work dropped without wait() still must complete: the buffer belongs to the caller.
    if (!done_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    if (sleep_.count() > 0)
      sleepy_waitall(reqs_, sleep_);
    else
      H5DDP_CHECK_MPI(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE));
    if (on_done_) on_done_();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    H5DDP_CHECK_MPI(MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE));
    done_ = flag != 0;
    if (done_ && on_done_) on_done_();
    return done_;
  }

 private:
  std::vector<MPI_Request> reqs_;
  std::chrono::microseconds sleep_;
  std::function<void()> on_done_;
  bool done_ = false;
};

// Completion state shared by a queued allreduce and its Work handle. Either `reqs` holds the requests of
// an MPI_Iallreduce the caller started (kProgress: the worker only tests them), or it is empty and the
// worker runs a blocking MPI_Allreduce on (buf, count) itself (kThread).
struct ThreadOp {
  void* buf = nullptr;
  size_t count = 0;
  DType dtype = DType::kU8;
  ReduceOp op = ReduceOp::kSum;
  std::vector<MPI_Request> reqs;
  std::function<void(MPI_Comm)> run;    // kThread: the blocking operation, when it is not an allreduce of buf
  std::function<void()> on_done;        // kProgress: runs once the requests completed, before complete()
  std::atomic<int>* waiters = nullptr;  // the worker polls without sleeping while someone waits
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void complete(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      error = e;
      done = true;
    }
    cv.notify_all();
  }
};

class ThreadWork final : public Work {
 public:
  explicit ThreadWork(std::shared_ptr<ThreadOp> op) : op_(std::move(op)) {}
  ~ThreadWork() override {
    // The buffer belongs to the caller: never return before the worker is done with it.
    block();
  }
  void wait() override {
    block();
    std::lock_guard<std::mutex> lock(op_->mutex);
    if (op_->error) {
      auto e = op_->error;
      op_->error = nullptr;  // rethrown once
      std::rethrow_exception(e);
    }
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(op_->mutex);
    return op_->done;
  }

 private:
  void block() {
    std::unique_lock<std::mutex> lock(op_->mutex);
    if (op_->done) return;
    op_->waiters->fetch_add(1);
    op_->cv.wait(lock, [&] { return op_->done; });
    op_->waiters->fetch_sub(1);
  }
  std::shared_ptr<ThreadOp> op_;
};

void allreduce_chunked(MPI_Comm comm, void* buf, size_t count, DType dtype, ReduceOp op, size_t chunk_bytes) {
  auto* p = static_cast<char*>(buf);
  const size_t es = dtype_size(dtype);
  for_each_chunk(count, elements_per_call(chunk_bytes, es), [&](size_t off, int n) {
    H5DDP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, p + off * es, n, mpi_datatype(dtype), mpi_op(op), comm));
  });
}

std::vector<MPI_Request> iallreduce_chunked(MPI_Comm comm, void* buf, size_t count, DType dtype, ReduceOp op,
                                            size_t chunk_bytes) {
  auto* p = static_cast<char*>(buf);
  const size_t es = dtype_size(dtype);
  std::vector<MPI_Request> reqs;
  for_each_chunk(count, elements_per_call(chunk_bytes, es), [&](size_t off, int n) {
    MPI_Request r;
    H5DDP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, p + off * es, n, mpi_datatype(dtype), mpi_op(op), comm, &r));
    reqs.push_back(r);
  });
  return reqs;
}

// A reduce-scatter in place, as one in-place reduce per rank's segment to that rank, in chunks of at most
// `chunk_bytes`: Open MPI's reduce-scatter allocates temporaries of the whole buffer's size (a bucket may be
// hundreds of MB, and ZeRO-2 counts every byte), a chunked reduce only of a chunk's. Each rank's sum lands in its
// own segment, where it belongs. `start(sendbuf, recvbuf, n, root)` issues one reduce.
template <class Reduce>
void reduce_to_owners(void* buf, const std::vector<int>& counts, DType dtype, int rank, size_t chunk_bytes,
                      Reduce&& reduce) {
  auto* p = static_cast<char*>(buf);
  const size_t es = dtype_size(dtype);
  size_t offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    const size_t count = static_cast<size_t>(counts[r]);
    for_each_chunk(count, elements_per_call(chunk_bytes, es), [&](size_t off, int n) {
      char* at = p + (offset + off) * es;
      if (static_cast<int>(r) == rank)
        reduce(MPI_IN_PLACE, at, n, static_cast<int>(r));
      else
        reduce(at, nullptr, n, static_cast<int>(r));
    });
    offset += count;
  }
}

}  // namespace

// One thread per communicator. kThread: runs queued allreduces (blocking) in submission order, which is the
// order ranks called allreduce_async in, as MPI requires. kProgress: tests the requests of non-blocking
// allreduces the caller started, sleeping `poll_interval` between unproductive rounds (so it costs little
// CPU next to backward) and, unless the node is oversubscribed, not sleeping while a caller waits.
class MpiComm::Worker {
 public:
  Worker(MPI_Comm comm, bool sleep_while_waiting, size_t chunk_bytes)
      : comm_(comm),
        interval_(poll_interval()),
        sleep_while_waiting_(sleep_while_waiting),
        chunk_bytes_(chunk_bytes),
        thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();  // finishes queued and active operations: they are collectives other ranks expect
  }
  void submit(std::shared_ptr<ThreadOp> op) {
    op->waiters = &waiters_;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    std::vector<std::shared_ptr<ThreadOp>> active;  // kProgress requests being tested
    for (;;) {
      std::deque<std::shared_ptr<ThreadOp>> incoming;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (active.empty()) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty() && active.empty()) return;
        incoming.swap(queue_);
      }
      for (auto& op : incoming) {
        if (!op->reqs.empty()) {
          active.push_back(std::move(op));
          continue;
        }
        std::exception_ptr error;
        try {
          if (op->run)
            op->run(comm_);
          else
            allreduce_chunked(comm_, op->buf, op->count, op->dtype, op->op, chunk_bytes_);
        } catch (...) {
          error = std::current_exception();
        }
        op->complete(error);
      }
      if (active.empty()) continue;
      bool progressed = false;
      for (size_t i = 0; i < active.size();) {
        int flag = 0;
        std::exception_ptr error;
        try {
          H5DDP_CHECK_MPI(MPI_Testall(static_cast<int>(active[i]->reqs.size()), active[i]->reqs.data(), &flag,
                                      MPI_STATUSES_IGNORE));
        } catch (...) {
          error = std::current_exception();
          flag = 1;
        }
        if (flag) {
          if (!error && active[i]->on_done) active[i]->on_done();
          active[i]->complete(error);
          active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
          progressed = true;
        } else {
          ++i;
        }
      }
      // Never spin flat out: on a machine with more ranks than cores a spinning thread takes the CPU the
      // other ranks need to reach the collective. Yield while someone waits (sleep there too when the
      // node has more ranks than cores), sleep otherwise.
      if (progressed) continue;
      if ((waiters_.load() > 0 && !sleep_while_waiting_) || interval_.count() == 0)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(interval_);
    }
  }

  MPI_Comm comm_;
  std::chrono::microseconds interval_;
  bool sleep_while_waiting_;
  size_t chunk_bytes_;
  std::atomic<int> waiters_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ThreadOp>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

MpiComm::MpiComm() = default;

MpiComm::AsyncMode MpiComm::default_async_mode(int ranks_on_node, unsigned cores) {
  if (const char* e = std::getenv("H5DDP_MPI_ASYNC")) {
    if (std::strcmp(e, "thread") == 0) return AsyncMode::kThread;
    if (std::strcmp(e, "nonblocking") == 0) return AsyncMode::kNonBlocking;
    if (std::strcmp(e, "progress") == 0) return AsyncMode::kProgress;
    throw ConfigError(std::string("H5DDP_MPI_ASYNC must be 'thread', 'progress' or 'nonblocking', not '") + e + "'");
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) return AsyncMode::kNonBlocking;
  const auto ranks = static_cast<unsigned>(std::max(1, ranks_on_node));
  return ranks <= cores && cores < 2 * ranks ? AsyncMode::kProgress : AsyncMode::kThread;
}

void MpiComm::set_async_mode(AsyncMode mode) {
  if (mode != AsyncMode::kNonBlocking) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    H5DDP_CHECK(provided >= MPI_THREAD_MULTIPLE,
                "MpiComm: the thread and progress async modes need MPI_THREAD_MULTIPLE (MPI granted level " +
                    std::to_string(provided) + ")");
  }
  async_mode_ = mode;
}

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI16:
      return MPI_INT16_T;
    case DType::kI8:
      return MPI_INT8_T;
    case DType::kU8:
      return MPI_UINT8_T;
    case DType::kU64:
      return MPI_UINT64_T;
    case DType::kBool:
      return MPI_UINT8_T;
    case DType::kF16:
    case DType::kBF16:
      return MPI_UINT16_T;  // bytes only: not reducible over MPI
  }
  throw ConfigError("no MPI datatype for dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  throw ConfigError("unknown reduce op");
}

std::unique_ptr<MpiComm> MpiComm::dup(MPI_Comm parent) {
  std::unique_ptr<MpiComm> c(new MpiComm());
  H5DDP_CHECK_MPI(MPI_Comm_dup(parent, &c->comm_));
  H5DDP_CHECK_MPI(MPI_Comm_set_errhandler(c->comm_, MPI_ERRORS_RETURN));
  H5DDP_CHECK_MPI(MPI_Comm_dup(parent, &c->async_comm_));
  H5DDP_CHECK_MPI(MPI_Comm_set_errhandler(c->async_comm_, MPI_ERRORS_RETURN));
  H5DDP_CHECK_MPI(MPI_Comm_rank(c->comm_, &c->rank_));
  H5DDP_CHECK_MPI(MPI_Comm_size(c->comm_, &c->size_));
  MPI_Comm node;
  H5DDP_CHECK_MPI(MPI_Comm_split_type(c->comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // What the ranks call must match: rank 0's async mode and chunk size everywhere. A bad H5DDP_MPI_ASYNC
  // is reported after the broadcast, so that no rank leaves the others waiting in it.
  constexpr uint64_t kBadMode = ~uint64_t{0};
  uint64_t agreed[2] = {kBadMode, reduce_chunk_bytes_from_env()};
  std::string bad_mode;
  try {
    agreed[0] = static_cast<uint64_t>(default_async_mode(local, cores));
  } catch (const ConfigError& e) {
    bad_mode = e.what();
  }
  H5DDP_CHECK_MPI(MPI_Bcast(agreed, 2, MPI_UINT64_T, 0, c->comm_));
  if (agreed[0] == kBadMode) throw ConfigError(bad_mode.empty() ? "rank 0's H5DDP_MPI_ASYNC is invalid" : bad_mode);
  c->set_async_mode(static_cast<AsyncMode>(agreed[0]));
  c->reduce_chunk_bytes_ = static_cast<size_t>(agreed[1]);
  // More ranks on this node than cores: waiting for an asynchronous allreduce sleeps between tests instead
  // of spinning. H5DDP_MPI_WAIT=spin|sleep overrides. Local: it changes how a rank waits, not what it calls.
  c->sleep_while_waiting_ = static_cast<unsigned>(local) > cores;
  c->poll_interval_ = std::max(std::chrono::microseconds(1), poll_interval());
  if (const char* e = std::getenv("H5DDP_MPI_WAIT")) {
    if (std::strcmp(e, "sleep") == 0)
      c->sleep_while_waiting_ = true;
    else if (std::strcmp(e, "spin") == 0)
      c->sleep_while_waiting_ = false;
    else
      throw ConfigError(std::string("H5DDP_MPI_WAIT must be 'spin' or 'sleep', not '") + e + "'");
  }
  return c;
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  worker_.reset();        // finishes queued operations (they are collectives other ranks take part in)
  if (finalized) return;  // too late to free; MPI already released everything
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  if (async_comm_ != MPI_COMM_NULL) MPI_Comm_free(&async_comm_);
}

void MpiComm::broadcast(void* buf, size_t count, DType dtype, int root) {
  auto* p = static_cast<char*>(buf);
  const size_t es = dtype_size(dtype);
  for_each_chunk(count, kMaxChunk, [&](size_t off, int n) {
    H5DDP_CHECK_MPI(MPI_Bcast(p + off * es, n, mpi_datatype(dtype), root, comm_));
  });
}

void MpiComm::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  H5DDP_CHECK(dtype != DType::kF16 && dtype != DType::kBF16, "MPI allreduce of 16-bit floats is not supported");
  allreduce_chunked(comm_, buf, count, dtype, op, reduce_chunk_bytes_);
}

std::unique_ptr<Work> MpiComm::allreduce_async(void* buf, size_t count, DType dtype, ReduceOp op) {
  H5DDP_CHECK(dtype != DType::kF16 && dtype != DType::kBF16, "MPI allreduce of 16-bit floats is not supported");
  if (async_mode_ != AsyncMode::kNonBlocking) {
    if (!worker_) worker_ = std::make_unique<Worker>(async_comm_, sleep_while_waiting_, reduce_chunk_bytes_);
    auto state = std::make_shared<ThreadOp>();
    state->buf = buf;
    state->count = count;
    state->dtype = dtype;
    state->op = op;
    // kProgress: started here, on the caller's thread, so the start order is the call order.
    if (async_mode_ == AsyncMode::kProgress)
      state->reqs = iallreduce_chunked(async_comm_, buf, count, dtype, op, reduce_chunk_bytes_);
    worker_->submit(state);
    return std::make_unique<ThreadWork>(std::move(state));
  }
  return std::make_unique<MpiWork>(iallreduce_chunked(async_comm_, buf, count, dtype, op, reduce_chunk_bytes_),
                                   sleep_while_waiting_ ? poll_interval_ : std::chrono::microseconds(0));
}

std::unique_ptr<Work> MpiComm::reduce_scatter_async(void* buf, const std::vector<size_t>& counts, DType dtype,
                                                    ReduceOp op) {
  H5DDP_CHECK(dtype != DType::kF16 && dtype != DType::kBF16, "MPI reduction of 16-bit floats is not supported");
  H5DDP_CHECK(counts.size() == static_cast<size_t>(size_), "reduce_scatter_async: counts must have one entry per rank");
  auto icounts = std::make_shared<std::vector<int>>();
  for (int r = 0; r < size_; ++r) {
    H5DDP_CHECK(counts[r] <= kMaxChunk, "reduce_scatter_async: a segment of more than 2^30 elements");
    icounts->push_back(static_cast<int>(counts[r]));
  }
  // One reduce per owner and chunk (reduce_to_owners): each rank's sum lands in its own segment, and no call
  // allocates more than a chunk, where one MPI_Reduce_scatter of a bucket allocated the bucket's size again.
  const int rank = rank_;
  const size_t chunk = reduce_chunk_bytes_;
  auto start = [=](MPI_Comm c) {
    std::vector<MPI_Request> reqs;
    reduce_to_owners(buf, *icounts, dtype, rank, chunk, [&](const void* send, void* recv, int n, int root) {
      MPI_Request r;
      H5DDP_CHECK_MPI(MPI_Ireduce(send, recv, n, mpi_datatype(dtype), mpi_op(op), root, c, &r));
      reqs.push_back(r);
    });
    return reqs;
  };
  if (async_mode_ != AsyncMode::kNonBlocking) {
    if (!worker_) worker_ = std::make_unique<Worker>(async_comm_, sleep_while_waiting_, reduce_chunk_bytes_);
    auto state = std::make_shared<ThreadOp>();
    if (async_mode_ == AsyncMode::kProgress) {
      state->reqs = start(async_comm_);
    } else {
      state->run = [=](MPI_Comm c) {
        reduce_to_owners(buf, *icounts, dtype, rank, chunk, [&](const void* send, void* recv, int n, int root) {
          H5DDP_CHECK_MPI(MPI_Reduce(send, recv, n, mpi_datatype(dtype), mpi_op(op), root, c));
        });
      };
    }
    worker_->submit(state);
    return std::make_unique<ThreadWork>(std::move(state));
  }
  return std::make_unique<MpiWork>(start(async_comm_),
                                   sleep_while_waiting_ ? poll_interval_ : std::chrono::microseconds(0), nullptr);
}

namespace {

// MPI_Allgatherv's counts and displacements of `counts` (one entry per rank), checked against int's range.
struct Segments {
  std::vector<int> counts, displs;
};
std::shared_ptr<Segments> segments(const std::vector<size_t>& counts, int size, const char* what) {
  H5DDP_CHECK(counts.size() == static_cast<size_t>(size), std::string(what) + ": counts must have one entry per rank");
  auto s = std::make_shared<Segments>();
  size_t offset = 0;
  for (int r = 0; r < size; ++r) {
    H5DDP_CHECK(counts[r] <= kMaxChunk && offset <= static_cast<size_t>(std::numeric_limits<int>::max()),
                std::string(what) + ": more than 2^31 elements in one call");
    s->counts.push_back(static_cast<int>(counts[r]));
    s->displs.push_back(static_cast<int>(offset));
    offset += counts[r];
  }
  return s;
}

}  // namespace

void MpiComm::allgatherv(void* buf, const std::vector<size_t>& counts, DType dtype) {
  const auto s = segments(counts, size_, "allgatherv");
  H5DDP_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, s->counts.data(), s->displs.data(),
                                 mpi_datatype(dtype), comm_));
}

std::unique_ptr<Work> MpiComm::allgatherv_async(void* buf, const std::vector<size_t>& counts, DType dtype) {
  // The count and displacement arrays must outlive the operation (MPI may read them until it completes): the
  // closures below hold them, and each Work holds its closure.
  const auto s = segments(counts, size_, "allgatherv_async");
  const MPI_Datatype type = mpi_datatype(dtype);
  auto start = [=](MPI_Comm c) {
    std::vector<MPI_Request> reqs(1);
    H5DDP_CHECK_MPI(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, s->counts.data(), s->displs.data(), type,
                                    c, reqs.data()));
    return reqs;
  };
  if (async_mode_ != AsyncMode::kNonBlocking) {
    if (!worker_) worker_ = std::make_unique<Worker>(async_comm_, sleep_while_waiting_, reduce_chunk_bytes_);
    auto state = std::make_shared<ThreadOp>();
    if (async_mode_ == AsyncMode::kProgress) {  // started here, on the caller's thread: start order = call order
      state->reqs = start(async_comm_);
      state->on_done = [s] {};
    } else {  // kThread: the worker runs the blocking collective, in submission order
      state->run = [=](MPI_Comm c) {
        H5DDP_CHECK_MPI(
            MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, s->counts.data(), s->displs.data(), type, c));
      };
    }
    worker_->submit(state);
    return std::make_unique<ThreadWork>(std::move(state));
  }
  return std::make_unique<MpiWork>(start(async_comm_),
                                   sleep_while_waiting_ ? poll_interval_ : std::chrono::microseconds(0), [s] {});
}

void MpiComm::allgather(const void* send, void* recv, size_t count, DType dtype) {
  H5DDP_CHECK(count <= kMaxChunk, "allgather of more than 2^30 elements per rank");
  H5DDP_CHECK_MPI(MPI_Allgather(send, static_cast<int>(count), mpi_datatype(dtype), recv, static_cast<int>(count),
                                mpi_datatype(dtype), comm_));
}

void MpiComm::barrier() {
  H5DDP_CHECK_MPI(MPI_Barrier(comm_));
}

}  // namespace h5ddp

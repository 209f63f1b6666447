#include "checkpoint/direct_write.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "checkpoint/direct_io.hpp"
#include "checkpoint/fault_inject.hpp"
#include "h5ddp/error.hpp"

namespace h5ddp::ckpt {
namespace {

using direct_io::kBlock;
constexpr int kWritesInFlight = 4;  // also the number of writer threads (each waits on the device, not a core)

struct Piece {
  size_t extent = 0;
  uint64_t begin = 0, len = 0;  // within the extent
  bool direct = false;          // whole aligned blocks: O_DIRECT
  bool bounce = false;          // direct, but the source is aligned unlike the file offset: copy first
  bool done = false;
  std::string error;
};

// The pieces of one extent: page-cache edges around whole blocks in pieces of kDirectPieceBytes.
void cut(const WriteExtent& x, size_t index, std::vector<Piece>& out) {
  auto add = [&](uint64_t b, uint64_t e, bool direct) {
    if (e <= b) return;
    Piece p;
    p.extent = index, p.begin = b, p.len = e - b, p.direct = direct;
    p.bounce = direct && !direct_io::aligned(reinterpret_cast<uintptr_t>(x.src + b));
    out.push_back(std::move(p));
  };
  const uint64_t body_begin = direct_io::round_up(x.offset) - x.offset,
                 body_end = direct_io::round_down(x.offset + x.n) - x.offset;
  if (x.n < kDirectWriteMinBytes || body_end <= body_begin) return add(0, x.n, false);
  add(0, body_begin, false);
  for (uint64_t b = body_begin; b < body_end; b += kDirectPieceBytes)
    add(b, std::min<uint64_t>(body_end, b + kDirectPieceBytes), true);
  add(body_end, x.n, false);
}

class Writer {
 public:
  Writer(const std::string& path, const std::vector<WriteExtent>& extents, RefuseDirect refuse)
      : path_(path), extents_(extents), refuse_(refuse) {
    buffered_.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (buffered_.fd < 0) throw CheckpointError(path + ": cannot open for writing: " + std::strerror(errno));
    if (refuse != RefuseDirect::kAtOpen) direct_.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
    use_direct_ = direct_.fd >= 0;
    for (size_t e = 0; e < extents.size(); ++e) cut(extents[e], e, pieces_);
  }

  ~Writer() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      abort_ = true;
    }
    for (auto& t : threads_) t.join();  // the writers read the caller's memory: never outlive the call
  }

  DirectWriteResult run(const std::function<void(uint64_t)>& progress) {
    const int threads = static_cast<int>(std::min<size_t>(kWritesInFlight, pieces_.size()));
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
    uint64_t done = 0;
    for (auto& p : pieces_) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return p.done; });
      }
      const auto& x = extents_[p.extent];
      if (!p.error.empty())
        throw CheckpointError(path_ + ": writing " + x.what + " (" + std::to_string(p.len) + " bytes at file offset " +
                              std::to_string(x.offset + p.begin) + "): " + p.error);
      done += p.len;
      if (progress) progress(done);
    }
    DirectWriteResult r;
    r.direct_bytes = direct_bytes_, r.bounced_bytes = bounced_bytes_, r.buffered_bytes = done - direct_bytes_;
    return r;
  }

 private:
  void work() {
    direct_io::AlignedBuffer bounce;
    for (;;) {
      Piece* p = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (abort_ || next_ == pieces_.size()) return;
        p = &pieces_[next_++];
      }
      if (p->bounce && use_direct_ && !bounce) bounce = direct_io::aligned_buffer(kDirectPieceBytes);
      std::string error = write(*p, bounce.get());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        p->error = std::move(error);
        p->done = true;
      }
      cv_.notify_all();
    }
  }

  // Writes piece p; returns "" or what went wrong. Never throws (it runs on a writer thread).
  std::string write(const Piece& p, char* bounce) {
    const auto& x = extents_[p.extent];
    const char* src = x.src + p.begin;
    const uint64_t off = x.offset + p.begin;
    if (p.direct && use_direct_ && (!p.bounce || bounce)) {
      if (p.bounce) std::memcpy(bounce, src, p.len);
      uint64_t put = 0;
      const std::string e = write_all(direct_.fd, p.bounce ? bounce : src, off, p.len, put, true);
      if (e.empty()) {
        direct_bytes_ += p.len;
        if (p.bounce) bounced_bytes_ += p.len;
        return {};
      }
      if (e != kRefused) return e;
      use_direct_ = false;  // the file system takes O_DIRECT only in name: the rest through the page cache
    }
    uint64_t put = 0;
    return write_all(buffered_.fd, src, off, p.len, put, false);
  }

  static constexpr const char* kRefused = "O_DIRECT refused";

  // pwrite until all n bytes are written; `put` counts them. An EINVAL on the first O_DIRECT write of the file
  // is kRefused (the caller falls back to the page cache).
  std::string write_all(int fd, const char* src, uint64_t off, uint64_t n, uint64_t& put, bool direct) {
    while (put < n) {
      ssize_t r = ::pwrite(fd, src + put, n - put, static_cast<off_t>(off + put));
      if (direct && refuse_ == RefuseDirect::kAtFirstRead && !wrote_direct_) r = -1, errno = EINVAL;
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && direct && errno == EINVAL && !wrote_direct_) return kRefused;
      if (r < 0) return std::string("pwrite failed: ") + std::strerror(errno);
      if (r == 0) return "pwrite wrote nothing";
      put += static_cast<uint64_t>(r);
      if (direct) wrote_direct_ = true;
      if (direct && put % kBlock != 0 && put < n) direct = false, fd = buffered_.fd;  // finish a short write
    }
    return {};
  }

  const std::string& path_;
  const std::vector<WriteExtent>& extents_;
  const RefuseDirect refuse_;
  direct_io::Fd buffered_, direct_;
  std::vector<Piece> pieces_;
  std::mutex mutex_;
  std::condition_variable cv_;
  size_t next_ = 0;
  bool abort_ = false;
  std::atomic<bool> use_direct_{false}, wrote_direct_{false};
  std::atomic<uint64_t> direct_bytes_{0}, bounced_bytes_{0};
  std::vector<std::thread> threads_;  // last: joined in the destructor before the members they use go
};

}  // namespace

DirectWriteResult write_extents_direct(const std::string& path, const std::vector<WriteExtent>& extents,
                                       const std::function<void(uint64_t done)>& progress, RefuseDirect refuse) {
  Writer writer(path, extents, refuse);
  return writer.run(progress);
}

RefuseDirect refuse_direct_for_tests(int rank) {
  if (fault_armed("refuse_direct_open", rank)) return RefuseDirect::kAtOpen;
  if (fault_armed("refuse_direct_write", rank)) return RefuseDirect::kAtFirstRead;
  return RefuseDirect::kNo;
}

}  // namespace h5ddp::ckpt

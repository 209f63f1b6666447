#include "checkpoint/direct_read.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include "checkpoint/direct_io.hpp"
#include "h5ddp/error.hpp"

namespace h5ddp::ckpt {
namespace {

using direct_io::aligned;
using direct_io::kBlock;

struct Piece {
  size_t extent = 0;
  uint64_t begin = 0, len = 0;  // within the extent
  bool bounce = false;          // not aligned: read through a bounce buffer
  char* buf = nullptr;          // the bounce buffer while the piece holds it
  const char* data = nullptr;   // where its bytes are once done (inside buf for a bounce piece)
  bool done = false;
  std::string error;
};

class Reader {
 public:
  Reader(const std::string& path, const std::vector<FileExtent>& extents, RefuseDirect refuse)
      : path_(path), extents_(extents), refuse_(refuse) {
    buffered_.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (buffered_.fd < 0) throw CheckpointError(path + ": cannot open: " + std::strerror(errno));
    if (refuse != RefuseDirect::kAtOpen) direct_.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    use_direct_ = direct_.fd >= 0;
    for (size_t e = 0; e < extents.size(); ++e)
      for (uint64_t b = 0; b < extents[e].n; b += kDirectPieceBytes) {
        Piece p;
        p.extent = e, p.begin = b, p.len = std::min<uint64_t>(kDirectPieceBytes, extents[e].n - b);
        const auto& x = extents[e];
        p.bounce = !aligned(reinterpret_cast<uintptr_t>(x.dst + b)) || !aligned(x.offset + b) || !aligned(p.len);
        pieces_.push_back(std::move(p));
      }
    for (int i = 0; i <= kDirectReadsInFlight; ++i) {
      pool_.push_back(direct_io::aligned_buffer(kDirectPieceBytes + 2 * kBlock));
      if (!pool_.back()) throw std::bad_alloc();
      free_.push_back(pool_.back().get());
    }
  }

  ~Reader() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      abort_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();  // the readers write into the caller's memory: never outlive the call
  }

  bool run(const std::function<void(size_t, const char*, size_t)>& consume) {
    for (int i = 0; i < kDirectReadsInFlight; ++i) threads_.emplace_back([this] { work(); });
    for (auto& p : pieces_) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return p.done; });
      }
      const auto& x = extents_[p.extent];
      if (!p.error.empty())
        throw CheckpointError(path_ + ": reading " + x.what + " (" + std::to_string(x.n) + " bytes at file offset " +
                              std::to_string(x.offset) + "): " + p.error);
      char* dst = x.dst + p.begin;
      if (p.data != dst) std::memcpy(dst, p.data, p.len);
      if (p.buf) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          free_.push_back(p.buf);
          p.buf = nullptr;
        }
        cv_.notify_all();
      }
      consume(p.extent, dst, p.len);
    }
    return used_direct_;
  }

 private:
  // Claims pieces in order; a bounce piece is claimed only with a free buffer, taken at the same time, so the
  // buffers always belong to the earliest pieces not yet consumed (the consumer can never wait for a piece
  // that waits for a buffer).
  void work() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] {
        return abort_ || next_ == pieces_.size() || !pieces_[next_].bounce || !use_direct_ || !free_.empty();
      });
      if (abort_ || next_ == pieces_.size()) return;
      Piece& p = pieces_[next_++];
      if (p.bounce && use_direct_) p.buf = free_.back(), free_.pop_back();
      lock.unlock();
      std::string error = read(p);
      lock.lock();
      p.error = std::move(error);
      p.done = true;
      cv_.notify_all();
    }
  }

  // Reads piece p; returns "" or what went wrong. Never throws (it runs on a reader thread).
  std::string read(Piece& p) {
    const auto& x = extents_[p.extent];
    const uint64_t off = x.offset + p.begin;
    char* dst = x.dst + p.begin;
    if (use_direct_) {
      // The aligned span that holds the piece; a bounce piece's bytes start `skip` into its buffer.
      const uint64_t from = p.buf ? direct_io::round_down(off) : off;
      const uint64_t to = p.buf ? direct_io::round_up(off + p.len) : off + p.len;
      char* into = p.buf ? p.buf : dst;
      const uint64_t need = off + p.len - from;
      uint64_t got = 0;
      while (got < to - from) {
        ssize_t r = ::pread(direct_.fd, into + got, to - from - got, static_cast<off_t>(from + got));
        if (refuse_ == RefuseDirect::kAtFirstRead && !used_direct_) r = -1, errno = EINVAL;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EINVAL && !used_direct_) {  // the file system takes O_DIRECT only in name
          use_direct_ = false;
          break;
        }
        if (r < 0) return std::string("pread failed: ") + std::strerror(errno);
        if (r == 0) break;  // end of file: fewer bytes than `need` is reported below
        got += static_cast<uint64_t>(r);
        used_direct_ = true;
        if (got % kBlock != 0) break;  // a short O_DIRECT read; the rest (if any) goes through the page cache
      }
      if (use_direct_) {
        if (got >= need) {
          p.data = into + (off - from);
          return {};
        }
        // Finish through the page cache from where O_DIRECT stopped (it reads only whole blocks).
        const uint64_t have = got > off - from ? got - (off - from) : 0;
        if (p.buf) std::memcpy(dst, into + (off - from), have);
        p.data = dst;
        return read_buffered(dst + have, off + have, p.len - have);
      }
    }
    p.data = dst;
    return read_buffered(dst, off, p.len);
  }

  std::string read_buffered(char* dst, uint64_t off, uint64_t len) {
    uint64_t got = 0;
    while (got < len) {
      const ssize_t r = ::pread(buffered_.fd, dst + got, len - got, static_cast<off_t>(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return std::string("pread failed: ") + std::strerror(errno);
      if (r == 0)
        return "the file ends at byte " + std::to_string(off + got) + ", inside the dataset (truncated file?)";
      got += static_cast<uint64_t>(r);
    }
    return {};
  }

  const std::string& path_;
  const std::vector<FileExtent>& extents_;
  const RefuseDirect refuse_;
  direct_io::Fd buffered_, direct_;
  std::vector<Piece> pieces_;
  std::vector<direct_io::AlignedBuffer> pool_;
  std::vector<char*> free_;
  std::mutex mutex_;
  std::condition_variable cv_;
  size_t next_ = 0;
  bool abort_ = false;
  std::atomic<bool> use_direct_{false}, used_direct_{false};
  std::vector<std::thread> threads_;  // last: joined in the destructor before the members they use go
};

}  // namespace

bool read_extents_direct(const std::string& path, const std::vector<FileExtent>& extents,
                         const std::function<void(size_t extent, const char* data, size_t n)>& consume,
                         RefuseDirect refuse) {
  Reader reader(path, extents, refuse);
  return reader.run(consume);
}

namespace {

std::atomic<uint64_t> g_coalesced_reads{0};

// Reads n bytes at `off` into dst with as many preads as it takes (each counted in `calls`); "" or what went
// wrong, with `*failed_at` the file offset where it did.
std::string pread_all(int fd, char* dst, uint64_t off, uint64_t n, size_t& calls, uint64_t* failed_at) {
  uint64_t got = 0;
  while (got < n) {
    ++calls;
    const ssize_t r = ::pread(fd, dst + got, n - got, static_cast<off_t>(off + got));
    if (r < 0 && errno == EINTR) continue;
    *failed_at = off + got;
    if (r < 0) return std::string("pread failed: ") + std::strerror(errno);
    if (r == 0) return "the file ends at byte " + std::to_string(off + got) + ", inside the dataset (truncated file?)";
    got += static_cast<uint64_t>(r);
  }
  return {};
}

// Extents [first, last] of the file order, read as one range [begin, end).
struct Group {
  size_t first = 0, last = 0;
  uint64_t begin = 0, end = 0;
};

std::vector<Group> groups_of(const std::vector<FileExtent>& x, const std::vector<size_t>& order, size_t piece) {
  std::vector<Group> out;
  for (size_t k = 0; k < order.size(); ++k) {
    const FileExtent& e = x[order[k]];
    if (!out.empty()) {
      Group& g = out.back();
      const bool joins = e.offset >= g.end && e.offset - g.end <= kMergeGapBytes && e.offset + e.n - g.begin <= piece;
      if (joins) {
        g.last = k, g.end = e.offset + e.n;
        continue;
      }
    }
    out.push_back(Group{k, k, e.offset, e.offset + e.n});
  }
  return out;
}

class Coalesced {
 public:
  Coalesced(const std::string& path, const std::vector<FileExtent>& x, size_t piece, bool bounce,
            const std::function<void(size_t, const char*, size_t)>& consume)
      : path_(path), x_(x), piece_(std::max<size_t>(piece, 1)), bounce_(bounce), consume_(consume), order_(x.size()) {
    fd_.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_.fd < 0) throw CheckpointError(path + ": cannot open: " + std::strerror(errno));
    std::iota(order_.begin(), order_.end(), size_t{0});
    std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) { return x[a].offset < x[b].offset; });
  }

  size_t run() {
    for (const Group& g : groups_of(x_, order_, piece_)) {
      if (g.first == g.last && (g.end - g.begin > piece_ || !bounce_))
        read_alone(order_[g.first]);
      else
        read_group(g);
    }
    g_coalesced_reads += calls_;
    return calls_;
  }

 private:
  // The group's one read into the buffer, then each extent's bytes to its dst.
  void read_group(const Group& g) {
    const uint64_t n = g.end - g.begin;
    if (buf_.size() < n) buf_.resize(n);
    uint64_t failed_at = 0;
    if (std::string e = pread_all(fd_.fd, buf_.data(), g.begin, n, calls_, &failed_at); !e.empty())
      fail(extent_at(g, failed_at), e);
    for (size_t k = g.first; k <= g.last; ++k) {
      const FileExtent& e = x_[order_[k]];
      std::memcpy(e.dst, buf_.data() + (e.offset - g.begin), e.n);
      consume_(order_[k], e.dst, e.n);
    }
  }

  // One extent in pieces of piece_ bytes, each straight into dst or (bounce_) through the buffer.
  void read_alone(size_t i) {
    const FileExtent& e = x_[i];
    for (uint64_t b = 0; b < e.n; b += piece_) {
      const uint64_t len = std::min<uint64_t>(piece_, e.n - b);
      if (bounce_ && buf_.size() < len) buf_.resize(len);
      char* into = bounce_ ? buf_.data() : e.dst + b;
      uint64_t failed_at = 0;
      if (std::string why = pread_all(fd_.fd, into, e.offset + b, len, calls_, &failed_at); !why.empty()) fail(i, why);
      if (bounce_) std::memcpy(e.dst + b, into, len);
      consume_(i, e.dst + b, len);
    }
  }

  // The extent of group g that holds file offset `at` (or the last one).
  size_t extent_at(const Group& g, uint64_t at) const {
    for (size_t k = g.first; k <= g.last; ++k)
      if (at < x_[order_[k]].offset + x_[order_[k]].n) return order_[k];
    return order_[g.last];
  }

  [[noreturn]] void fail(size_t i, const std::string& why) const {
    const FileExtent& e = x_[i];
    throw CheckpointError(path_ + ": reading " + e.what + " (" + std::to_string(e.n) + " bytes at file offset " +
                          std::to_string(e.offset) + "): " + why);
  }

  const std::string& path_;
  const std::vector<FileExtent>& x_;
  const size_t piece_;
  const bool bounce_;
  const std::function<void(size_t, const char*, size_t)>& consume_;
  std::vector<size_t> order_;
  direct_io::Fd fd_;
  std::vector<char> buf_;
  size_t calls_ = 0;
};

}  // namespace

size_t read_extents_coalesced(const std::string& path, const std::vector<FileExtent>& extents, size_t piece,
                              bool bounce,
                              const std::function<void(size_t extent, const char* data, size_t n)>& consume) {
  if (extents.empty()) return 0;
  return Coalesced(path, extents, piece, bounce, consume).run();
}

uint64_t coalesced_read_calls() {
  return g_coalesced_reads.load();
}

}  // namespace h5ddp::ckpt

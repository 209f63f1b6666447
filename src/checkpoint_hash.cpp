// Checksums off the I/O path: a background hasher that overlaps XXH3 with the writes (save) and reads
// (load), a sample hash for the cheap replica check, and the phase timer of the debug timelines.
// XXH_INLINE_ALL compiles XXH3 into this file, with its flags (-O3, see io.cmake): 0.040 s per GiB on the
// 2-core VM of docs/BENCHMARKS.md against 0.066 s through Debian's libxxhash.so, same hash values.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include "checkpoint_internal.hpp"

namespace h5ddp::ckpt {

uint64_t hash_bytes(const void* data, size_t n) { return XXH3_64bits(data, n); }

StreamHash::StreamHash() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
StreamHash::~StreamHash() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void StreamHash::update(const void* data, size_t n) { XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n); }
uint64_t StreamHash::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

uint64_t sample_hash(const void* data, size_t n) {
  constexpr size_t kBlock = 4096, kBlocks = 16;
  const auto* p = static_cast<const uint8_t*>(data);
  if (n <= kBlock * kBlocks) return XXH3_64bits_withSeed(data, n, n);
  // Blocks at evenly spaced offsets, the first at 0 and the last ending at n.
  std::vector<uint8_t> sample(kBlock * kBlocks);
  for (size_t i = 0; i < kBlocks; ++i)
    std::memcpy(sample.data() + i * kBlock, p + (n - kBlock) / (kBlocks - 1) * i, kBlock);
  return XXH3_64bits_withSeed(sample.data(), sample.size(), n);
}

BackgroundHasher::BackgroundHasher(size_t slots) : results_(slots, 0), thread_([this] { loop(); }) {}

BackgroundHasher::~BackgroundHasher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  cv_.notify_all();
  thread_.join();  // the queued byte ranges belong to the caller: never leave a job running past us
}

void BackgroundHasher::submit(size_t slot, const void* data, size_t n) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Job{slot, data, n});
    ++pending_;
  }
  cv_.notify_all();
}

void BackgroundHasher::record(size_t slot, uint64_t hash) {
  std::lock_guard<std::mutex> lock(mutex_);
  results_[slot] = hash;
}

std::vector<uint64_t> BackgroundHasher::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return pending_ == 0; });
  return results_;
}

void BackgroundHasher::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) return;  // closing, nothing left
    const Job job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    const uint64_t h = hash_bytes(job.data, job.n);
    lock.lock();
    results_[job.slot] = h;
    if (--pending_ == 0) cv_.notify_all();
  }
}

PhaseTimer::PhaseTimer() : start_(Clock::now()), last_(start_) {}

void PhaseTimer::mark(const char* phase) {
  const auto now = Clock::now();
  timeline_ += std::string(" ") + phase + "=" + std::to_string(std::chrono::duration<double>(now - last_).count());
  last_ = now;
}

double PhaseTimer::total_seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

}  // namespace h5ddp::ckpt

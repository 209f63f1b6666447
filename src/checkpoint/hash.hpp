// Checksums (private to h5ddp_checkpoint): XXH3 of bytes in one call, in pieces, of a sample, or on a background
// thread that overlaps the I/O.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace h5ddp::ckpt {

// XXH3 (64 bits) of the bytes, with the fastest kernel this CPU runs (or the one H5DDP_HASH_KERNEL names).
uint64_t hash_bytes(const void* data, size_t n);
// The XXH3 kernels this CPU runs ("default": XXH3 as xxhash.h compiles for the target; "avx2" on x86-64 CPUs
// with AVX2), which one hash_bytes uses, and a named one: all give the same values, tests compare them.
std::vector<std::string> hash_kernels();
std::string hash_kernel();
uint64_t hash_bytes_with(const std::string& kernel, const void* data, size_t n);
// XXH3 of bytes fed in pieces: digest() equals hash_bytes() of their concatenation.
class StreamHash {
 public:
  StreamHash();
  explicit StreamHash(const std::string& kernel);
  ~StreamHash();
  StreamHash(const StreamHash&) = delete;
  StreamHash& operator=(const StreamHash&) = delete;
  void update(const void* data, size_t n);
  uint64_t digest() const;
  // The state as bytes, and back (chained_hashes passes it between ranks of one program).
  std::vector<uint8_t> state_bytes() const;
  void set_state_bytes(const std::vector<uint8_t>& bytes);

 private:
  explicit StreamHash(void (*update)(void* state, const void* data, size_t n));
  void* state_;  // XXH3_state_t (xxhash.h stays out of this header)
  void (*update_)(void* state, const void* data, size_t n);
};
// XXH3 of a sample of the bytes, seeded with n: all of them up to 64 KiB, else 16 blocks of 4 KiB spread
// evenly from the first byte to the last. The cheap replica check of save_checkpoint compares these.
uint64_t sample_hash(const void* data, size_t n);

// Hashes byte ranges (XXH3) on one background thread, so that checksums overlap the I/O: save_checkpoint
// hashes while it writes, load_checkpoint while it reads. The bytes must stay valid until finish() or the
// destructor, which both wait for every submitted range.
class BackgroundHasher {
 public:
  explicit BackgroundHasher(size_t slots);
  ~BackgroundHasher();
  BackgroundHasher(const BackgroundHasher&) = delete;
  BackgroundHasher& operator=(const BackgroundHasher&) = delete;
  void submit(size_t slot, const void* data, size_t n);
  // Stores a hash the caller computed itself (load hashes while it reads), so finish() returns all of them.
  void record(size_t slot, uint64_t hash);
  // Waits for everything submitted so far; result[slot] is the hash of the range submitted (or recorded) for
  // slot (0 if none).
  std::vector<uint64_t> finish();

 private:
  struct Job {
    size_t slot;
    const void* data;
    size_t n;
  };
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<uint64_t> results_;
  size_t pending_ = 0;
  bool closing_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace h5ddp::ckpt

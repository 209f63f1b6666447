// Checksums off the I/O path: a background hasher that overlaps XXH3 with the writes (save) and reads
// (load), a sample hash for the cheap replica check.
// XXH_INLINE_ALL compiles XXH3 into this file, with its flags (-O3, see CMakeLists.txt): 0.040 s per GiB on the
// 2-core VM of docs/DEFAULTS.md against 0.066 s through Debian's libxxhash.so, same hash values.
// On x86-64 an AVX2 build of the same XXH3 (xxh3_avx2.c) is chosen at run time where the CPU has AVX2: on data
// still in the cache, which is how load hashes what it has just read, it takes 0.025 s per GiB against 0.038.
#include "checkpoint/hash.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"

#if defined(H5DDP_XXH3_AVX2)
extern "C" uint64_t h5ddp_xxh3_avx2_hash(const void* data, size_t n);
extern "C" void h5ddp_xxh3_avx2_update(void* state, const void* data, size_t n);
#endif

namespace h5ddp::ckpt {

namespace {

struct HashKernel {
  const char* name;
  bool (*usable)();
  uint64_t (*hash)(const void* data, size_t n);
  void (*update)(void* state, const void* data, size_t n);  // state: an XXH3_state_t
};

// The XXH3_state_t layout comes from the one xxhash.h, so any kernel's update continues any other's state.
const HashKernel kKernels[] = {
    {"default", [] { return true; }, [](const void* p, size_t n) -> uint64_t { return XXH3_64bits(p, n); },
     [](void* s, const void* p, size_t n) { XXH3_64bits_update(static_cast<XXH3_state_t*>(s), p, n); }},
#if defined(H5DDP_XXH3_AVX2)
    {"avx2",
     [] {
       __builtin_cpu_init();  // in case the first hash runs in a static constructor, before libgcc's
       return __builtin_cpu_supports("avx2") != 0;
     },
     h5ddp_xxh3_avx2_hash, h5ddp_xxh3_avx2_update},
#endif
};

const HashKernel* find_kernel(const std::string& name) {
  for (const auto& k : kKernels)
    if (name == k.name && k.usable()) return &k;
  return nullptr;
}

// The last usable kernel of kKernels (the fastest), or the one H5DDP_HASH_KERNEL names (benchmarks compare them).
const HashKernel& chosen_kernel() {
  static const HashKernel* const kernel = [] {
    const HashKernel* best = &kKernels[0];
    for (const auto& k : kKernels)
      if (k.usable()) best = &k;
    if (const char* e = std::getenv("H5DDP_HASH_KERNEL")) {
      if (const HashKernel* k = find_kernel(e)) return k;
      log::warn(std::string("H5DDP_HASH_KERNEL=") + e + " is not a hash kernel this CPU runs; using " + best->name);
    }
    return best;
  }();
  return *kernel;
}

const HashKernel& kernel_named(const std::string& name) {
  if (const HashKernel* k = find_kernel(name)) return *k;
  throw Error("no hash kernel named '" + name + "' runs on this CPU");
}

}  // namespace

std::vector<std::string> hash_kernels() {
  std::vector<std::string> names;
  for (const auto& k : kKernels)
    if (k.usable()) names.emplace_back(k.name);
  return names;
}

std::string hash_kernel() {
  return chosen_kernel().name;
}

uint64_t hash_bytes(const void* data, size_t n) {
  return chosen_kernel().hash(data, n);
}

uint64_t hash_bytes_with(const std::string& kernel, const void* data, size_t n) {
  return kernel_named(kernel).hash(data, n);
}

StreamHash::StreamHash() : StreamHash(chosen_kernel().update) {}
StreamHash::StreamHash(const std::string& kernel) : StreamHash(kernel_named(kernel).update) {}
StreamHash::StreamHash(void (*update)(void*, const void*, size_t)) : state_(XXH3_createState()), update_(update) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
StreamHash::~StreamHash() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
void StreamHash::update(const void* data, size_t n) {
  update_(state_, data, n);
}
uint64_t StreamHash::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}
std::vector<uint8_t> StreamHash::state_bytes() const {
  const auto* p = static_cast<const uint8_t*>(state_);
  return std::vector<uint8_t>(p, p + sizeof(XXH3_state_t));
}
void StreamHash::set_state_bytes(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != sizeof(XXH3_state_t)) throw CheckpointError("a hash state of the wrong size arrived");
  auto* st = static_cast<XXH3_state_t*>(state_);
  const unsigned char* secret = st->extSecret;  // an address in this process: the other one's means nothing here
  std::memcpy(st, bytes.data(), bytes.size());
  st->extSecret = secret;
}

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

}  // namespace h5ddp::ckpt

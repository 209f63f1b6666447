// h5ddp-bench-checkpoint: one checkpoint of S GiB saved and loaded three ways, side by side in one run:
//   h5ddp  save_checkpoint / load_checkpoint (both load strategies)
//   raw    MPI-IO collective write/read of the same bytes (each rank its contiguous share; load then
//          broadcasts the shares so every rank holds everything): the practical limit
//   raw_direct  (load only, with raw) the same reads with O_DIRECT, two in flight: h5ddp's technique for a rank
//          alone on its host, without HDF5 or checksums
// What PyTorch users run (Python torch.save / torch.load of the same state) and dd of the same bytes are
// measured by tools/bench/torch_ckpt_peer.py; tools/bench/checkpoint_bench.sh interleaves the two programs.
//
//   mpirun -np 2 h5ddp-bench-checkpoint --gib 1 --dir /tmp/bench [--fsync 1] [--load 1]
//                                       [--methods h5ddp,raw,raw_direct,no_early_writeback,mpiio] [--reps R] [--tensors
//                                       K]
//                                       [--verify 0|1]
//                                       [--settle SECONDS] [--order N]
//                                       [--alignment BYTES] [--mpiio-hint key=value]...
//                                       [--keep PATH]
// --keep PATH: the last timed h5ddp save's file is moved to PATH instead of deleted (tools/bench/template_save.cpp
// reads it).
// Every RESULT line also carries what the operation asked of MPI, the most any rank did (tools/bench/mpi_counters.c):
// collectives entered, bytes contributed to them, point-to-point messages and bytes, MPI-IO calls.
//
// Times are wall clock between barriers (the slowest rank). Before every load the file is fdatasync'ed and
// evicted from the page cache (posix_fadvise DONTNEED), so loads read the disk. Extra memory is the rise of
// the peak RSS (VmHWM, reset through /proc/self/clear_refs before each operation) over the RSS before it,
// max over ranks. Prints "RESULT key=value ..." lines on rank 0 for tools/bench/checkpoint_bench.sh.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "mpi_counters.h"

namespace {

using namespace h5ddp;
namespace fs = std::filesystem;
constexpr size_t kChunk = 256u << 20;  // MPI counts are int: move bytes in chunks

struct Options {
  double gib = 1;
  std::string dir = "/tmp/h5ddp-bench";
  bool fsync = true;
  bool load = true;
  // Seconds between evicting a file and loading it. 0 loads at once; a resume comes seconds after the memory
  // was freed, which on a VM that hands free memory back to its host (free page reporting) matters: see
  // docs/DEFAULTS.md "Direct reads".
  double settle = 0;
  int tensors = 48;  // a third model weights, two thirds Adam state (exp_avg, exp_avg_sq)
  std::string methods = "h5ddp,raw,raw_direct";
  int reps = 1;
  int order = 0;       // added to the repetition number where methods take turns (the driver's repetition)
  bool verify = true;  // load_checkpoint's checksum verification (on by default, as in the trainer)
  uint64_t alignment = uint64_t{1} << 20;  // SaveOptions::alignment (--alignment; the default's measurement)
  MpiioHints hints;                        // --mpiio-hint key=value (repeatable)
  std::string keep;                        // --keep PATH: the last h5ddp file is moved there, not deleted
  bool has(const char* m) const { return methods.find(m) != std::string::npos; }
};

long status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, std::strlen(key), key) == 0) return std::stol(line.substr(std::strlen(key) + 1));
  return 0;
}

void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

uint64_t fingerprint(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  return h;
}

class Bench {
 public:
  Bench(MpiComm& comm, const Options& o) : comm_(comm), o_(o) {
    const size_t per = static_cast<size_t>(o.gib * (1ull << 30)) / o.tensors / 4096 * 4096;
    bytes_ = per * o.tensors;
    arena_.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes_)));
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < bytes_; i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(arena_.get() + i, &x, 8);
    }
    fingerprint_ = fingerprint(arena_.get(), bytes_);
    const int layers = o.tensors / 3;
    ParamGroup group;
    group.hyper = {{"lr", 1e-3},  {"betas0", 0.9},     {"betas1", 0.999},
                   {"eps", 1e-8}, {"weight_decay", 0}, {"amsgrad", 0}};
    for (int i = 0; i < o.tensors; ++i) {
      const std::string param = "layers." + std::to_string(i % layers) + ".weight";
      const char* keys[] = {"", "/exp_avg", "/exp_avg_sq"};
      TensorRef t{
          param + keys[i / layers], DType::kF32, {static_cast<int64_t>(per / 4096), 1024}, arena_.get() + i * per};
      if (i < layers) {
        state_.model.push_back(t);
        group.params.push_back(param);
      } else {
        state_.optimizer.state.push_back(t);
      }
    }
    // Adam's int64 step per parameter (docs/FORMAT.md: a state group is complete); 8 bytes each, not in the arena.
    steps_.assign(layers, 1000);
    for (int i = 0; i < layers; ++i)
      state_.optimizer.state.push_back(
          TensorRef{"layers." + std::to_string(i) + ".weight/step", DType::kI64, {}, &steps_[i]});
    state_.optimizer.type = "adam";
    state_.optimizer.groups = {group};
    state_.counters.step = 1000;
    state_.rng.cpu.assign(5056, static_cast<uint8_t>(comm.rank()));
    fs::create_directories(o.dir);
  }

  void run() {
    const std::string h5 = o_.dir + "/bench.h5", raw = o_.dir + "/raw.bin";
    // Untimed warm-ups of the same size, one per writer: on these VMs the first large writes after a process
    // starts ran at a third of the speed of later ones for every method (h5ddp's first save: pwrite64 of 10 MB
    // in 30-100 ms, then 0.1 s for the whole 0.45 GiB share), which would penalise whichever runs first.
    // Timed operations are then each method's steady state, as in a run that checkpoints periodically.
    raw_io(raw, true);
    remove(raw);
    if (o_.has("h5ddp")) {
      save_h5ddp();
      remove_h5ddp(h5);
    }
    for (int rep = 0; rep < o_.reps; ++rep) {
      if (o_.has("h5ddp")) save_load_h5ddp(h5, rep + o_.order);
      if (o_.has("raw")) save_load_raw(raw);
      if (o_.has("no_early_writeback")) save_without_early_writeback(h5);
      if (o_.has("mpiio")) save_through_mpiio(h5);
    }
  }

 private:
  void save_load_h5ddp(const std::string& h5, int rep) {
    measure("save", "h5ddp", [&] { save_h5ddp(); });
    if (o_.load) {
      // The two strategies take turns going first (--order): the first load after a save ran slower on these
      // VMs whichever strategy it was.
      std::vector<std::pair<const char*, LoadStrategy>> strategies = {
          {"h5ddp_every_rank_reads", LoadStrategy::kEveryRankReads},
          {"h5ddp_share_exchange", LoadStrategy::kShareExchange}};
      if (rep % 2 == 1) std::swap(strategies[0], strategies[1]);
      for (auto [name, strategy] : strategies) {
        cold(h5);
        LoadOptions lo;
        lo.strategy = strategy;
        lo.verify_checksums = o_.verify;
        lo.mpiio_hints = o_.hints;
        measure("load", name, [&] { load_checkpoint(comm_, h5, state_, lo); });
        check(name);
      }
    }
    keep(h5);
    remove_h5ddp(h5);
  }
  // --keep PATH: the file just measured goes to PATH (rank 0 moves it; a copy across file systems).
  void keep(const std::string& h5) {
    if (!o_.keep.empty() && comm_.rank() == 0) {
      std::error_code ec;
      fs::rename(h5, o_.keep, ec);
      if (ec) fs::copy_file(h5, o_.keep, fs::copy_options::overwrite_existing);
    }
    comm_.barrier();
  }
  // A/B of the early writeback (H5DDP_EARLY_WRITEBACK=0 turns it off): the same save without it.
  void save_without_early_writeback(const std::string& h5) {
    ::setenv("H5DDP_EARLY_WRITEBACK", "0", 1);
    measure("save", "h5ddp_no_early_writeback", [&] { save_h5ddp(); });
    ::unsetenv("H5DDP_EARLY_WRITEBACK");
    remove_h5ddp(h5);
  }
  // A/B of the write mode (issue 46): the same save with the tensor bytes through MPI-IO and the page cache
  // (--checkpoint-write mpiio) instead of the default O_DIRECT writes.
  void save_through_mpiio(const std::string& h5) {
    measure("save", "h5ddp_mpiio", [&] { save_h5ddp(WriteMode::kMpiio); });
    remove_h5ddp(h5);
  }
  void save_h5ddp(WriteMode mode = WriteMode::kAuto) {
    SaveOptions so;
    so.write_mode = mode;
    so.fsync = o_.fsync;
    so.name = "bench.h5";
    so.alignment = o_.alignment;
    so.mpiio_hints = o_.hints;
    save_checkpoint(comm_, state_, o_.dir, so);
  }
  void remove_h5ddp(const std::string& h5) {
    remove(h5);
    remove(o_.dir + "/latest");
  }
  void save_load_raw(const std::string& raw) {
    measure("save", "raw_mpiio", [&] { raw_io(raw, true); });
    // Loaded twice, as h5ddp's file is (once per strategy): on this VM the second read of a file after it
    // was written and evicted is slower than the first (0.24 s against 0.21 s for 1 GiB at 1 rank), so
    // each h5ddp load has a raw load in the same position to compare with.
    // raw_direct goes before raw_mpiio: on a VM that hands free memory back to its host, how fast the page
    // cache fills depends on how recently memory was freed, so the operation after this function (the next
    // repetition's h5ddp save) follows a page-cache load and its eviction, as the raw save does (after h5ddp's
    // share + exchange load). With raw_direct last, the h5ddp saves of 3 GiB at 1 rank without fsync took 0.86,
    // 1.63 and 2.41 s in one run, the raw saves 0.42-0.55 s.
    for (int i = 0; o_.load && i < 2; ++i) {
      if (o_.has("raw_direct")) {
        cold(raw);
        measure("load", "raw_direct", [&] { raw_direct_read(raw); });
        check("raw_direct");
      }
      cold(raw);
      measure("load", "raw_mpiio", [&] { raw_io(raw, false); });
      check("raw_mpiio");
    }
    remove(raw);
  }
  void measure(const char* op, const char* method, const std::function<void()>& f) {
    comm_.barrier();
    reset_peak_rss();
    const long base = status_kib("VmRSS:");
    mpi_counters before{}, after{};
    mpi_counters_read(&before);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    mpi_counters_read(&after);
    comm_.barrier();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t extra = status_kib("VmHWM:") - base;
    comm_.allreduce(&extra, 1, DType::kI64, ReduceOp::kMax);
    // What this operation asked of MPI, the most any rank did (tools/bench/mpi_counters.c).
    uint64_t counts[] = {after.collectives - before.collectives, after.collective_bytes - before.collective_bytes,
                         after.p2p_messages - before.p2p_messages, after.p2p_bytes - before.p2p_bytes,
                         after.file_calls - before.file_calls};
    comm_.allreduce(counts, 5, DType::kU64, ReduceOp::kMax);
    if (comm_.rank() == 0)
      std::printf(
          "RESULT gib=%.2f ranks=%d fsync=%d op=%s method=%s seconds=%.3f gbps=%.3f extra_rss_mib=%.1f "
          "extra_rss_pct=%.1f tensors=%d collectives=%llu coll_bytes=%llu p2p=%llu p2p_bytes=%llu file_calls=%llu\n",
          bytes_ / double(1ull << 30), comm_.size(), o_.fsync ? 1 : 0, op, method, s, bytes_ / s / 1e9, extra / 1024.0,
          100.0 * extra * 1024.0 / bytes_, o_.tensors, static_cast<unsigned long long>(counts[0]),
          static_cast<unsigned long long>(counts[1]), static_cast<unsigned long long>(counts[2]),
          static_cast<unsigned long long>(counts[3]), static_cast<unsigned long long>(counts[4]));
    std::fflush(stdout);
  }

  void cold(const std::string& path) {
    if (comm_.rank() == 0) evict(path);
    if (o_.settle > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o_.settle));
    comm_.barrier();
  }
  void remove(const std::string& path) {
    if (comm_.rank() == 0) fs::remove(path);
    comm_.barrier();
  }
  void check(const char* what) {
    const bool ok = fingerprint(arena_.get(), bytes_) == fingerprint_;
    if (!comm_.all_ok(ok)) throw Error(std::string(what) + " load did not restore the state's bytes");
  }

  // Each rank writes (reads) its contiguous share of the arena with collective MPI-IO; reads then
  // broadcast every share so that every rank holds the whole state, as a checkpoint load must.
  void raw_io(const std::string& path, bool write) {
    MPI_File fh;
    H5DDP_CHECK_MPI(MPI_File_open(comm_.handle(), path.c_str(),
                                  write ? (MPI_MODE_CREATE | MPI_MODE_WRONLY) : MPI_MODE_RDONLY, MPI_INFO_NULL, &fh));
    const auto [b, e] = share(comm_.rank());
    size_t rounds = 0;  // the same on every rank: enough for the largest share
    for (int k = 0; k < comm_.size(); ++k)
      rounds = std::max(rounds, (share(k).second - share(k).first + kChunk) / kChunk);
    for (size_t i = 0; i < rounds; ++i) {
      const size_t off = std::min(e, b + i * kChunk), len = std::min(kChunk, e - off);
      if (write)
        H5DDP_CHECK_MPI(MPI_File_write_at_all(fh, off, arena_.get() + off, int(len), MPI_BYTE, MPI_STATUS_IGNORE));
      else
        H5DDP_CHECK_MPI(MPI_File_read_at_all(fh, off, arena_.get() + off, int(len), MPI_BYTE, MPI_STATUS_IGNORE));
    }
    if (write && o_.fsync) H5DDP_CHECK_MPI(MPI_File_sync(fh));
    H5DDP_CHECK_MPI(MPI_File_close(&fh));
    if (!write) broadcast_shares();
  }

  // The same reads as raw_io's load with the technique h5ddp's load uses where a rank is alone on its host:
  // O_DIRECT, kDirectReads preads of 16 MiB in flight, straight into the (page-aligned) arena; no checksums.
  void raw_direct_read(const std::string& path) {
    constexpr int kDirectReads = 2;
    constexpr size_t kPiece = 16u << 20;
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) throw Error(path + ": O_DIRECT open failed");
    const auto [b, e] = share(comm_.rank());
    std::atomic<size_t> next{b};
    std::atomic<bool> failed{false};
    auto work = [&] {
      for (size_t off; (off = next.fetch_add(kPiece)) < e;) {
        const size_t len = std::min(kPiece, e - off);
        if (::pread(fd, arena_.get() + off, len, static_cast<off_t>(off)) != static_cast<ssize_t>(len)) failed = true;
      }
    };
    std::vector<std::thread> readers;
    for (int i = 0; i < kDirectReads; ++i) readers.emplace_back(work);
    for (auto& t : readers) t.join();
    ::close(fd);
    if (failed) throw Error(path + ": O_DIRECT read failed");
    broadcast_shares();
  }

  // Rank k's contiguous share [first, second) of the arena for the raw methods, cut at 4 KiB boundaries (the
  // O_DIRECT alignment; the arena and its size are multiples of 4 KiB).
  std::pair<size_t, size_t> share(int k) const {
    const size_t n = static_cast<size_t>(comm_.size()), block = 4096;
    auto edge = [&](size_t i) { return i == n ? bytes_ : bytes_ * i / n / block * block; };
    return {edge(static_cast<size_t>(k)), edge(static_cast<size_t>(k) + 1)};
  }
  // After a raw load: every rank broadcasts its share, so that every rank holds the whole state.
  void broadcast_shares() {
    for (int k = 0; k < comm_.size(); ++k)
      comm_.broadcast(arena_.get() + share(k).first, share(k).second - share(k).first, DType::kU8, k);
  }

  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  MpiComm& comm_;
  Options o_;
  size_t bytes_ = 0;
  std::unique_ptr<uint8_t, Free> arena_;
  uint64_t fingerprint_ = 0;
  std::vector<int64_t> steps_;  // Adam steps (state_ points into it)
  TrainState state_;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--gib")
      o.gib = std::stod(v);
    else if (k == "--dir")
      o.dir = v;
    else if (k == "--fsync")
      o.fsync = v == "1";
    else if (k == "--load")
      o.load = v == "1";
    else if (k == "--methods")
      o.methods = v;
    else if (k == "--verify")
      o.verify = v == "1";
    else if (k == "--settle")
      o.settle = std::stod(v);
    else if (k == "--order")
      o.order = std::stoi(v);
    else if (k == "--reps")
      o.reps = std::max(1, std::stoi(v));
    else if (k == "--tensors")
      o.tensors = std::max(3, std::stoi(v) / 3 * 3);
    else if (k == "--alignment")
      o.alignment = std::stoull(v);
    else if (k == "--keep")
      o.keep = v;
    else if (k == "--mpiio-hint")
      o.hints.push_back(parse_mpiio_hint(v));
    else
      throw ConfigError("unknown option " + k);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnv env(&argc, &argv);
  try {
    auto comm = MpiComm::dup(MPI_COMM_WORLD);
    Bench(*comm, parse(argc, argv)).run();
    return 0;
  } catch (const std::exception& e) {
    die_with_exception(e);
  }
}

// h5ddp-bench-async (issue 8): what an asynchronous checkpoint costs the training loop, side by side with a
// synchronous one, in one run. State: --state-mib MiB of float32 tensors, replicated on every rank as in
// DDP. A "step" is a fixed amount of arithmetic over part of the state (so a background writer competing
// for cores shows up as fewer steps per second) plus one small allreduce (the step agreement).
//   1. sync save time (save_checkpoint), repeated --reps times
//   2. async blocked time per checkpoint (AsyncCheckpointer::start), same count
//   3. throughput: --steps steps with no checkpoints, sync every K steps, async every K steps (the checkpoint
//      lands mid-interval, at steps K/2, 3K/2, ..., so every one of them and its background write falls inside
//      the timed window); --rounds R repeats the three runs R times, rotating their order (the machine's
//      speed drifts over minutes), and reports medians
// Prints one markdown table per section (rank 0). Driver: tools/bench/async_bench.sh.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/async_checkpoint.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Options {
  size_t state_mib = 1024;
  int tensors = 64;
  int reps = 3;
  int steps = 300;
  int every = 100;         // K: checkpoint every K steps in the throughput runs
  int rounds = 1;          // repetitions of (none, sync, async), order rotated
  size_t work_kib = 2048;  // floats updated per step (KiB of state touched)
  int work_passes = 8;     // arithmetic passes over that slice per step
  std::string dir = "/tmp/h5ddp-bench-async";
  bool fsync = true;
  bool floor = false;  // also run the plain background writer (section 4)
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--state-mib")
      o.state_mib = std::stoul(v);
    else if (k == "--tensors")
      o.tensors = std::stoi(v);
    else if (k == "--reps")
      o.reps = std::stoi(v);
    else if (k == "--steps")
      o.steps = std::stoi(v);
    else if (k == "--every")
      o.every = std::stoi(v);
    else if (k == "--rounds")
      o.rounds = std::max(1, std::stoi(v));
    else if (k == "--work-kib")
      o.work_kib = std::stoul(v);
    else if (k == "--work-passes")
      o.work_passes = std::stoi(v);
    else if (k == "--dir")
      o.dir = v;
    else if (k == "--fsync")
      o.fsync = v != "0";
    else if (k == "--floor")
      o.floor = v != "0";
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return o;
}

struct State {
  std::vector<std::vector<float>> storage;
  h5ddp::TrainState ts;
  size_t cursor = 0;  // next float the step updates (walks over the whole state)

  explicit State(const Options& o) {
    const size_t total = o.state_mib << 20, per = total / o.tensors / sizeof(float);
    storage.resize(o.tensors);
    for (int i = 0; i < o.tensors; ++i) {
      storage[i].assign(per, 0.001f * static_cast<float>(i));
      h5ddp::TensorRef t;
      t.name = "layer" + std::to_string(i) + ".weight";
      t.dtype = h5ddp::DType::kF32;
      t.shape = {static_cast<int64_t>(per / 1024), 1024};
      t.data = storage[i].data();
      ts.model.push_back(t);
    }
    ts.optimizer.type = "sgd";
    ts.rng.cpu.assign(16, 7);
  }

  // The same work on every rank: replicas stay bit-identical, as after a DDP step.
  void step(const Options& o) {
    const size_t n = o.work_kib * 1024 / sizeof(float);
    for (size_t done = 0; done < n;) {
      auto& v = storage[(cursor / storage[0].size()) % storage.size()];
      const size_t off = cursor % v.size(), len = std::min(n - done, v.size() - off);
      float* p = v.data() + off;
      for (int pass = 0; pass < o.work_passes; ++pass)
        for (size_t j = 0; j < len; ++j) p[j] = p[j] * 0.999f + 0.0001f * std::sqrt(static_cast<float>(j + pass));
      cursor += len;
      done += len;
    }
    ++ts.counters.step;
  }
};

// The floor: what any background writer of these bytes costs here. One thread per save, nice like h5ddp's
// writer (H5DDP_ASYNC_NICE, default 10), plain write() + fsync of a copy made at start(); retention = unlink
// of the file from two saves before. Buffer reused between saves, as h5ddp's arena is. Aborts on an I/O
// error: a benchmark, not a checkpointer.
class PlainBackgroundWriter {
 public:
  explicit PlainBackgroundWriter(std::string dir) : dir_(std::move(dir)) {}
  ~PlainBackgroundWriter() { wait(); }
  // Each rank writes its 1/size share of the bytes to its own file (h5ddp's ranks share one file).
  void start(const State& s, int rank, int size, bool fsync) {
    wait();
    size_t total = 0;
    for (const auto& v : s.storage) total += v.size() * sizeof(float);
    if (buffer_.size() != total) buffer_.resize(total);
    size_t off = 0;
    for (const auto& v : s.storage) {
      std::memcpy(buffer_.data() + off, v.data(), v.size() * sizeof(float));
      off += v.size() * sizeof(float);
    }
    const std::string path = dir_ + "/plain-" + std::to_string(rank) + "-" + std::to_string(n_) + ".bin";
    const std::string old = dir_ + "/plain-" + std::to_string(rank) + "-" + std::to_string(n_ - 2) + ".bin";
    ++n_;
    const size_t begin = total * rank / size, end = total * (rank + 1) / size;
    thread_ = std::thread([this, path, old, fsync, begin, end] {
      const char* e = std::getenv("H5DDP_ASYNC_NICE");
      const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
      ::setpriority(PRIO_PROCESS, tid, std::min(19, ::getpriority(PRIO_PROCESS, tid) + (e ? std::atoi(e) : 10)));
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) std::abort();
      for (size_t done = begin; done < end;) {
        const ssize_t w = ::write(fd, buffer_.data() + done, std::min<size_t>(end - done, 64u << 20));
        if (w <= 0) std::abort();
        done += static_cast<size_t>(w);
      }
      if (fsync) ::fsync(fd);
      ::close(fd);
      ::unlink(old.c_str());
    });
  }
  void wait() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::string dir_;
  std::vector<char> buffer_;
  std::thread thread_;
  long n_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    h5ddp::MpiEnv env(&argc, &argv);
    const Options o = parse(argc, argv);
    auto comm = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
    const bool root = comm->rank() == 0;
    namespace fs = std::filesystem;
    if (root) {
      fs::remove_all(o.dir);
      fs::create_directories(o.dir);
    }
    comm->barrier();
    State s(o);
    h5ddp::SaveOptions so;
    so.fsync = o.fsync;
    so.retention.keep_last = 2;
    auto agree = [&] {
      double x = 1;
      comm->allreduce(&x, 1, h5ddp::DType::kF64, h5ddp::ReduceOp::kSum);
    };

    // 1 + 2: save times. Async: start() right after the previous save completed (wait), as in a run with
    // checkpoints far enough apart; "blocked" is start() alone, "total" is start() + the background write.
    std::vector<double> sync_s, blocked_s, copy_s, async_total_s;
    h5ddp::AsyncCheckpointer async(*comm);
    // Warm-up: the first start() allocates and first-touches the host buffers (the only allocation;
    // reported separately), and the first save warms the file system.
    const auto tw = Clock::now();
    async.start(s.ts, o.dir, so);
    double first_blocked = async.last_timing().blocked_seconds;
    async.wait();
    double first_total = since(tw);
    for (int r = 0; r < o.reps; ++r) {
      s.step(o);
      comm->barrier();
      auto t0 = Clock::now();
      h5ddp::save_checkpoint(*comm, s.ts, o.dir, so);
      sync_s.push_back(since(t0));
      s.step(o);
      comm->barrier();
      t0 = Clock::now();
      async.start(s.ts, o.dir, so);
      blocked_s.push_back(async.last_timing().blocked_seconds);
      copy_s.push_back(async.last_timing().copy_seconds);
      async.wait();
      async_total_s.push_back(since(t0));
    }
    double reduce[4] = {median(sync_s), median(blocked_s), median(copy_s), median(async_total_s)};
    comm->allreduce(reduce, 4, h5ddp::DType::kF64, h5ddp::ReduceOp::kMax);  // the slowest rank decides
    if (root) {
      std::printf("\n### Save: %zu MiB of state, %d ranks, fsync %s (median of %d, slowest rank)\n\n", o.state_mib,
                  comm->size(), o.fsync ? "on" : "off", o.reps);
      std::printf(
          "| sync save (s) | async: blocked (s) | of which copy (s) | async: start to committed (s) | blocked / sync "
          "|\n");
      std::printf("|---:|---:|---:|---:|---:|\n");
      std::printf("| %.3f | %.3f | %.3f | %.3f | %.1f%% |\n", reduce[0], reduce[1], reduce[2], reduce[3],
                  100.0 * reduce[1] / reduce[0]);
      std::printf(
          "\nfirst async save (allocates and first-touches the host buffers, not in the table): blocked "
          "%.3f s, committed after %.3f s\n",
          first_blocked, first_total);
      std::printf("host buffer allocations over %d async saves: %d (%zu MiB)\n", o.reps + 1, async.buffer_allocations(),
                  async.buffer_bytes() >> 20);
      std::fflush(stdout);
    }

    // 3: throughput with checkpoints every K steps.
    PlainBackgroundWriter plain(o.dir);
    auto run = [&](int mode, int steps) {  // 0 none, 1 sync, 2 async, 3 plain background writer (floor)
      comm->barrier();
      const auto t0 = Clock::now();
      double blocked = 0;
      for (int i = 1; i <= steps; ++i) {
        s.step(o);
        agree();
        if (mode == 2 && async.in_flight()) async.poll();
        if (mode != 0 && i % o.every == o.every / 2) {
          const auto tb = Clock::now();
          if (mode == 1)
            h5ddp::save_checkpoint(*comm, s.ts, o.dir, so);
          else if (mode == 2)
            async.start(s.ts, o.dir, so);
          else
            plain.start(s, comm->rank(), comm->size(), o.fsync);
          blocked += since(tb);
        }
      }
      const double train_s = since(t0);  // what training saw; the last async save may still be writing
      if (mode == 2) async.wait();
      if (mode == 3) plain.wait();
      double r[2] = {train_s, blocked};
      comm->allreduce(r, 2, h5ddp::DType::kF64, h5ddp::ReduceOp::kMax);
      return std::pair<double, double>(r[0], r[1]);
    };
    run(0, std::min(o.steps, 200));  // warm-up (page cache, first-touch)
    if (o.floor) {
      plain.start(s, comm->rank(), comm->size(), o.fsync);  // warm-up: allocates and first-touches its buffer
      plain.wait();
    }
    const int modes = o.floor ? 4 : 3;
    std::vector<double> wall[4], blocked[4];
    for (int r = 0; r < o.rounds; ++r)
      for (int k = 0; k < modes; ++k) {
        const int mode = (k + r) % modes;
        const auto x = run(mode, o.steps);
        wall[mode].push_back(x.first);
        blocked[mode].push_back(x.second);
      }
    auto med = [&](int mode) { return std::pair<double, double>(median(wall[mode]), median(blocked[mode])); };
    const auto none = med(0), sync = med(1), asy = med(2), floor = med(3);
    if (root) {
      const double step_s = none.first / o.steps;
      std::printf(
          "\n### Throughput: %d steps of %.1f ms, checkpoint every %d steps (every %.1f s without checkpoints), "
          "median of %d rounds\n\n",
          o.steps, 1000 * step_s, o.every, step_s * o.every, o.rounds);
      std::printf("| checkpoints | wall (s) | steps/s | vs none | blocked in saves (s) |\n|---|---:|---:|---:|---:|\n");
      auto row = [&](const char* name, std::pair<double, double> x) {
        std::printf("| %s | %.2f | %.2f | %.1f%% | %.2f |\n", name, x.first, o.steps / x.first,
                    100.0 * none.first / x.first, x.second);
      };
      const char* names[] = {"none", "sync", "async", "floor"};
      std::printf("per round (s):");
      for (int m = 0; m < modes; ++m) {
        std::printf(" %s", names[m]);
        for (double w : wall[m]) std::printf(" %.2f", w);
        std::printf(";");
      }
      std::printf("\n\n");
      row("none", none);
      row("sync", sync);
      row("async", asy);
      if (o.floor) row("plain background write (floor)", floor);
      std::fflush(stdout);
    }
    comm->barrier();
    if (root) fs::remove_all(o.dir);
    comm.reset();
  } catch (const std::exception& e) {
    h5ddp::die_with_exception(e);
  }
  return 0;
}

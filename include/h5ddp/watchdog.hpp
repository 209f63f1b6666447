// A stall detector for collectives and steps. A rank that waits in an allreduce for a peer that never
// comes (killed, deadlocked, stuck on storage) would otherwise hang the job until the scheduler's time
// limit; the watchdog turns that into a prompt MPI_Abort with a message naming the host, rank and what
// was stalled. Usage:
//   Watchdog wd(config.watchdog_seconds);             // 0 = disabled: guards cost one branch
//   { auto g = wd.guard("allreduce of step flags"); comm.allreduce(...); }
// One background thread per Watchdog; guards may nest and may be created from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace h5ddp {

class Watchdog {
 public:
  // Exit code passed to MPI_Abort when a stall is detected (EX_SOFTWARE from sysexits.h).
  static constexpr int kExitStalled = 70;

  // Called on the watchdog thread with the full message when a guard outlives its deadline.
  // The default handler prints the message to stderr and calls MpiEnv::abort(kExitStalled).
  using StallHandler = std::function<void(const std::string& message)>;

  // Local. seconds <= 0 disables the watchdog (no thread is started, guards do nothing).
  explicit Watchdog(double seconds, StallHandler on_stall = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool enabled() const { return seconds_ > 0; }
  double seconds() const { return seconds_; }

  // RAII scope of one watched operation; move-only. Ending the scope disarms it.
  class Guard {
   public:
    Guard() = default;
    Guard(Guard&& o) noexcept : owner_(o.owner_), id_(o.id_) { o.owner_ = nullptr; }
    Guard& operator=(Guard&& o) noexcept;
    ~Guard() { release(); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    // Disarms early (idempotent).
    void release() noexcept;

   private:
    friend class Watchdog;
    Guard(Watchdog* owner, uint64_t id) : owner_(owner), id_(id) {}
    Watchdog* owner_ = nullptr;
    uint64_t id_ = 0;
  };

  // Local. Arms a deadline of seconds() from now for the operation described by `what`
  // ("allreduce of step flags at step 120"). A no-op guard when the watchdog is disabled.
  [[nodiscard]] Guard guard(std::string what);
  // Local. Same, with a deadline other than the default (e.g. a save, which may take longer than a step).
  [[nodiscard]] Guard guard(std::string what, double seconds);

  // Number of stalls reported so far (the handler ran); for tests with a non-aborting handler.
  int stalls() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::string what;
    Clock::time_point started, deadline;
    double seconds = 0;
    bool reported = false;
  };
  void disarm(uint64_t id) noexcept;
  void loop();

  double seconds_ = 0;
  StallHandler on_stall_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> active_;
  uint64_t next_id_ = 1;
  int stalls_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// h5ddp-train's automatic watchdog (--watchdog-seconds auto): the least a step and a save get.
constexpr double kAutoWatchdogStepFloor = 300;
constexpr double kAutoWatchdogSaveFloor = 900;

// The automatic limit of an operation that repeats (a training step, a save): `factor` times the slowest one
// seen so far, never below `floor` (the limit before anything was measured, and the allowance for a slow
// moment: a busy machine, a cold file system). Pure; each rank keeps its own.
class AutoLimit {
 public:
  AutoLimit(double floor_seconds, double factor) : floor_(floor_seconds), factor_(factor) {}
  void observe(double seconds) { slowest_ = seconds > slowest_ ? seconds : slowest_; }
  double seconds() const { return factor_ * slowest_ > floor_ ? factor_ * slowest_ : floor_; }
  double slowest() const { return slowest_; }

 private:
  double floor_, factor_, slowest_ = 0;
};

}  // namespace h5ddp

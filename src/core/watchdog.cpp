#include "h5ddp/watchdog.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "h5ddp/error.hpp"
#include "h5ddp/mpi_env.hpp"

namespace h5ddp {
namespace {

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

void abort_job(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  MpiEnv::abort(Watchdog::kExitStalled);
}

}  // namespace

Watchdog::Watchdog(double seconds, StallHandler on_stall)
    : seconds_(seconds), on_stall_(on_stall ? std::move(on_stall) : StallHandler(abort_job)) {
  if (enabled()) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Watchdog::Guard Watchdog::guard(std::string what) {
  return guard(std::move(what), seconds_);
}

Watchdog::Guard Watchdog::guard(std::string what, double seconds) {
  if (!enabled() || seconds <= 0) return Guard();
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_id_++;
    Entry e;
    e.what = std::move(what);
    e.started = Clock::now();
    e.deadline = e.started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    e.seconds = seconds;
    active_.emplace(id, std::move(e));
  }
  cv_.notify_all();
  return Guard(this, id);
}

int Watchdog::stalls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stalls_;
}

void Watchdog::disarm(uint64_t id) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  active_.erase(id);
  // No notify: the thread waking at a stale deadline finds nothing expired and sleeps again.
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    const auto now = Clock::now();
    auto next = Clock::time_point::max();
    std::string message;
    for (auto& [id, e] : active_) {
      if (e.reported) continue;
      if (e.deadline <= now) {
        e.reported = true;
        ++stalls_;
        const double waited = std::chrono::duration<double>(now - e.started).count();
        message = "h5ddp: watchdog: " + process_tag() + " '" + e.what + "' has not completed after " +
                  format_seconds(waited) + " s (limit " + format_seconds(e.seconds) +
                  " s, --watchdog-seconds): a peer rank is probably dead or stuck; aborting the job "
                  "(MPI_Abort, exit code " +
                  std::to_string(kExitStalled) + ")";
        // Guards nest (a step around its allreduce): the innermost active one is what this rank waits in.
        std::string chain;
        for (const auto& [other_id, other] : active_) chain += (chain.empty() ? "" : " > ") + other.what;
        message += "; in progress on this rank: " + chain;
        break;
      }
      next = std::min(next, e.deadline);
    }
    if (!message.empty()) {
      // The handler may block or end the process; never hold the lock across it.
      lock.unlock();
      on_stall_(message);
      lock.lock();
      continue;
    }
    if (next == Clock::time_point::max())
      cv_.wait(lock);
    else
      cv_.wait_until(lock, next);
  }
}

Watchdog::Guard& Watchdog::Guard::operator=(Guard&& o) noexcept {
  if (this != &o) {
    release();
    owner_ = std::exchange(o.owner_, nullptr);
    id_ = o.id_;
  }
  return *this;
}

void Watchdog::Guard::release() noexcept {
  if (owner_) owner_->disarm(id_);
  owner_ = nullptr;
}

}  // namespace h5ddp

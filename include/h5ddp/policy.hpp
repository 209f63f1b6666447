// When to save and what to keep, as small pure objects: no communication, no file system, no clock. The
// callers feed them what they measured or listed (Checkpointer::agree_step the agreed triggers, RunDir's
// retention the run directory's listing) and act on the answer. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace h5ddp {

// Why a save is due; several may hold at once.
struct SaveDecision {
  bool step = false;    // step is a multiple of every_steps
  bool time = false;    // every_seconds have passed since the last save
  bool signal = false;  // a stop signal arrived: save, then leave the loop
  bool due() const { return step || time || signal; }
};

// When to save: every N steps, every T seconds, on a stop signal (always). 0 (or less) turns a trigger off.
class SavePolicy {
 public:
  SavePolicy() = default;
  SavePolicy(int64_t every_steps, double every_seconds) : every_steps_(every_steps), every_seconds_(every_seconds) {}

  // Pure. every_steps > 0 and step % every_steps == 0.
  bool step_due(int64_t step) const;
  // Pure. every_seconds > 0 and seconds_since_last_save >= every_seconds. Under data parallelism this is one
  // rank's view: the ranks agree on it as "due on any rank" (the time of the rank whose clock ran longest).
  bool time_due(double seconds_since_last_save) const;
  // Pure. The decision of a single process from what it measured.
  SaveDecision decide(int64_t step, double seconds_since_last_save, bool stop_signal) const;
  // Pure. The decision from inputs every rank agreed on (in Checkpointer::agree_step's one allreduce: the time
  // trigger and a stop signal of any rank), hence the same on every rank.
  SaveDecision decide_agreed(int64_t step, bool time_due_on_any_rank, bool stop_signal_on_any_rank) const;

  int64_t every_steps() const { return every_steps_; }
  double every_seconds() const { return every_seconds_; }

 private:
  int64_t every_steps_ = 0;
  double every_seconds_ = 0;
};

// One committed checkpoint of a run directory as retention sees it.
struct CheckpointEntry {
  std::string file;             // file name in the run directory (no folder)
  int64_t step = -1;            // from the name (ckpt-<step>.h5)
  std::optional<double> value;  // the keep-best metric read from its /meta; none: missing or not a number
};

// Which value of KeepPolicy::best_metric is better.
enum class MetricOrder { kHigherIsBetter, kLowerIsBetter };

// What to keep: the last K, every M-th step, named files, the best N by a metric of /meta. A file is kept when
// any rule keeps it; keep_last 0 keeps everything (the other rules only add to what the K newest keep).
struct KeepPolicy {
  int keep_last = 0;                    // the K newest files by step (0 or less: keep all, delete nothing)
  int keep_every = 0;                   // also every file whose step is a multiple of M (0 or less: none)
  std::vector<std::string> keep_files;  // file names never deleted (e.g. --keep-best's `best`)
  // Also the keep_best files with the best value of /meta[best_metric] ("" or keep_best <= 0: off). A file
  // whose value is missing, unparseable or NaN is never among the best (other rules may still keep it). Equal
  // values: the lower step wins (a later file must beat the best, as --keep-best's `best` pointer does).
  std::string best_metric;
  int keep_best = 0;
  MetricOrder best_order = MetricOrder::kHigherIsBetter;

  // Pure. The policy that keeps the `keep_last` newest files and nothing more.
  static KeepPolicy last(int keep_last) {
    KeepPolicy p;
    p.keep_last = keep_last;
    return p;
  }
  // Whether the policy needs CheckpointEntry::value (best_metric set, keep_best > 0, keep_last > 0).
  bool needs_values() const;
  // Pure. The files of `entries` to delete, highest step first (the order retention removes them in). `pinned`
  // names files kept whatever the rules say (the file just saved, the one `latest` names). Equal steps are
  // ordered by file name, descending.
  std::vector<std::string> files_to_delete(const std::vector<CheckpointEntry>& entries,
                                           const std::vector<std::string>& pinned = {}) const;
};

// Pure. A /meta string as a metric value: the whole string (surrounding blanks allowed) parsed as a finite or
// infinite double; std::nullopt for an empty, partly numeric or NaN string.
std::optional<double> parse_metric(const std::string& text);

}  // namespace h5ddp

// Goodput: how much of a run's time became training that was kept (docs/GOODPUT.md). An account, per segment (one
// process lifetime, from its process start to its last record), read from RUN_DIR/metrics.jsonl: training kept,
// training lost (steps trained, then redone after a kill), saves that blocked training, start-up and load,
// evaluations, other; the gaps between segments (queue waits) apart. Torch-free: h5ddp-ckpt goodput, and
// h5ddp-train's line at the end of each segment, use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/metrics.hpp"

namespace h5ddp {

struct SegmentAccount {
  int index = 0;           // 1, 2, ... in the log's order
  bool resumed = false;    // began with a "resume" record (else "start")
  int64_t first_step = 0;  // the step it started from
  int64_t last_step = 0;   // the highest step of its kept "train" records (first_step: none)
  int world_size = 0;
  bool process_start_known = false;  // false: a log older than process_start; start-up counts as 0
  double process_start = 0;          // seconds since the epoch (rank 0's process)
  double last_time = 0;              // its last record's time (a "lost" record's: the last dropped record's)
  std::string ended;                 // "end", "stop (exit 75)", "error", "killed" (no last record)
  double wall = 0, startup = 0, load = 0, train_kept = 0, train_lost = 0, blocked = 0, eval = 0, other = 0;
  int64_t lost_steps = 0;  // steps it trained that a later segment redid
  int64_t lost_first = 0, lost_last = 0;
};

struct GoodputAccount {
  std::vector<SegmentAccount> segments;
  std::vector<double> gaps;  // gaps[i]: from segment i's last record to segment i+1's process start
  double wall = 0, startup = 0, train_kept = 0, train_lost = 0, blocked = 0, eval = 0, other = 0, gaps_total = 0;
  int64_t lost_steps = 0;
  // Kept training time / the segments' total wall time (0 when there is none).
  double goodput() const { return wall > 0 ? train_kept / wall : 0; }
};

// Local, pure. The account of a metrics log's records, in the file's order.
GoodputAccount goodput_account(const std::vector<MetricsRecord>& records);
// Local. The records of a metrics log (lines that do not parse are skipped). Throws ConfigError naming `path`
// when it cannot be read, or holds no "start" or "resume" record (no run recorded).
std::vector<MetricsRecord> read_metrics_log(const std::string& path);

// The report of `h5ddp-ckpt goodput`: a table of the segments, the gaps, the totals and the goodput.
std::string goodput_report(const GoodputAccount& a, const std::string& source);
// The same as one JSON object: {"segments":[...],"gaps":[...],"total":{...}}.
std::string goodput_json(const GoodputAccount& a);
// h5ddp-train's line at the end of a segment: the last segment's goodput and the run's.
std::string goodput_line(const GoodputAccount& a);

// The process start, as early as it can be known: the kernel's start time of this process (/proc/self/stat),
// else the time note_main_entry() was first called (the top of main()). Seconds since the epoch.
struct ProcessStart {
  double seconds = 0;
  const char* source = "main";  // "proc" or "main"
};
ProcessStart process_start();
// Local: call first thing in main(); the fallback of process_start() where /proc is not readable.
void note_main_entry();

}  // namespace h5ddp

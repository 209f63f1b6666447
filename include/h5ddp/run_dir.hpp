// A run directory: the committed ckpt-<step>.h5 files (never *.partial, which are saves in progress or that
// died), the resume candidates, the `latest` and `best` pointers, and retention (KeepPolicy). docs/FORMAT.md
// describes the files. Methods marked Local touch the file system from the calling rank only: in a
// data-parallel run rank 0 moves pointers and applies retention, the others do not; Collective methods must be
// called by every rank of `comm` and return the same on every rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "h5ddp/comm.hpp"
#include "h5ddp/policy.hpp"

namespace h5ddp {

// The checkpoints an automatic resume tries, in order (RunDir::resume_candidates): every ckpt-<step>.h5 of the run
// directory from the highest step down (never a *.partial). The rename of <name>.partial to <name> is the commit
// point (docs/FORMAT.md), so the newest complete file comes first even when a kill left `latest` naming an older
// one; `latest` is a pointer for people and tools. A file `latest` names whose name carries no step
// (SaveOptions::name) comes first; latest_index is the position of the file `latest` names (-1: none). Nothing is
// opened or verified: the trainer loads the first one that loads (load_checkpoint verifies as it reads, through
// resume_newest), so a resume reads the checkpoint once.
struct ResumeCandidates {
  std::vector<std::string> paths;
  int latest_index = -1;
};

// What RUN_DIR/best says: "<file> <value>" (h5ddp-train --keep-best: the test accuracy).
struct BestPointer {
  std::string file;  // file name in the run directory
  double value = 0;
};

class RunDir {
 public:
  static constexpr const char* kBestFile = "best";

  explicit RunDir(std::string path);
  const std::string& path() const { return path_; }
  // path()/file_name.
  std::string file_path(const std::string& file_name) const;

  // Local. The committed checkpoints (ckpt-<step>.h5), highest step first (equal steps: name descending);
  // CheckpointEntry::value unset. A missing directory lists nothing; any other listing error sets `error`
  // when given (the entries found until then are returned).
  std::vector<CheckpointEntry> checkpoints(std::error_code* error = nullptr) const;
  // Local. The names of the *.h5.partial files: saves in progress, or that died.
  std::vector<std::string> partials(std::error_code* error = nullptr) const;

  // Collective (rank 0 lists, the list is broadcast), the same list on every rank. The files an automatic resume
  // tries, in order (ResumeCandidates).
  ResumeCandidates resume_candidates(Comm& comm) const;

  // Local. The file name `latest` holds (first line, trailing blanks and \r dropped); "" when it is missing or
  // unreadable. Not checked against the directory.
  std::string latest() const;
  // Local (rank 0 of a save). Moves `latest` to file_name atomically: latest.tmp written, fsynced, renamed over,
  // the directory fsynced (fsync false: no fsyncs). Throws CheckpointError naming the file.
  void move_latest(const std::string& file_name, bool fsync) const;

  // Local. What `best` says; std::nullopt when it is missing or its first line is not "<file> <number>". Not
  // checked against the directory.
  std::optional<BestPointer> best() const;
  // Collective. best() as rank 0 reads it, the same on every rank.
  std::optional<BestPointer> best(Comm& comm) const;
  // Local (one rank). Moves `best` to "<file> <value with 6 decimals>\n", the way `latest` moves. Throws
  // CheckpointError naming the file.
  void move_best(const std::string& file_name, double value, bool fsync) const;
  // Local (one rank). Replaces path()/name with `text` the way `latest` moves: <name>.tmp written, fsynced,
  // renamed over, the directory fsynced (fsync false skips both fsyncs). For other pointers of a run directory.
  // Throws CheckpointError naming the file.
  void write_pointer(const std::string& name, const std::string& text, bool fsync) const;

  // Local (rank 0 of a save, after `latest` moved; saves are collective and sequential). Removes every
  // *.h5.partial (a save that died: "removed stale partial checkpoint <path>"), then the checkpoints
  // `policy` gives up; `newest` (the file just saved) and the file `latest` names are always kept. With a
  // best_metric, each candidate's /meta is read (a file that cannot be read has no value). Never throws:
  // problems are logged as warnings. Returns the names of the checkpoints removed.
  std::vector<std::string> apply_retention(const KeepPolicy& policy, const std::string& newest) const;

 private:
  std::string path_;
};

}  // namespace h5ddp

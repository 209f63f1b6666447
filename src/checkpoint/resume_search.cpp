// Finding the checkpoint to resume from: the candidates of a run directory tried from the newest down, and the
// warning of a fresh run started beside an earlier run's checkpoints.
#include <filesystem>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/run_dir.hpp"

namespace fs = std::filesystem;

namespace h5ddp {

std::optional<std::string> resume_newest(Comm& comm, const std::string& run_dir,
                                         const std::function<void(const std::string& path)>& attempt) {
  const ResumeCandidates c = RunDir(run_dir).resume_candidates(comm);
  std::string why;  // what was wrong with the candidates skipped so far
  for (size_t i = 0; i < c.paths.size(); ++i) {
    const bool named_by_latest = static_cast<int>(i) == c.latest_index;
    try {
      attempt(c.paths[i]);
      if (!why.empty() && comm.rank() == 0) log::warn("resuming from " + c.paths[i] + " instead:" + why);
      if (c.latest_index > static_cast<int>(i) && comm.rank() == 0)
        log::info("resuming from " + c.paths[i] + ", newer than " + c.paths[c.latest_index] +
                  " named by `latest` (a save was interrupted after its commit point, before `latest` moved)");
      return c.paths[i];
    } catch (const CheckpointMismatchError&) {
      throw;
    } catch (const DisagreementError&) {
      throw;
    } catch (const Error& e) {
      why += "\n  " + std::string(named_by_latest ? "(named by latest) " : "") + e.what();
    }
  }
  if (!why.empty() && comm.rank() == 0)
    log::warn("no valid checkpoint in " + run_dir + ", starting from scratch:" + why);
  return std::nullopt;
}

std::vector<std::string> warn_of_checkpoints_in_fresh_run_dir(Comm& comm, const std::string& run_dir) {
  const ResumeCandidates c = RunDir(run_dir).resume_candidates(comm);
  std::string listing;  // rank 0 checks existence (`latest` may name a missing file) and broadcasts
  if (comm.rank() == 0)
    for (const auto& p : c.paths)
      if (format::checkpoint_step_from_name(fs::path(p).filename().string()) >= 0 && fs::exists(p)) listing += p + "\n";
  listing = comm.broadcast_string(listing, 0);
  std::vector<std::string> found;
  for (size_t pos = 0, nl; (nl = listing.find('\n', pos)) != std::string::npos; pos = nl + 1)
    found.push_back(listing.substr(pos, nl - pos));
  if (found.empty() || comm.rank() != 0) return found;
  std::string names;
  for (size_t i = 0; i < found.size() && i < 8; ++i) names += "\n  " + found[i];
  if (found.size() > 8) names += "\n  ... (" + std::to_string(found.size() - 8) + " more)";
  log::warn("starting fresh (--resume none) in " + run_dir + ", which holds " + std::to_string(found.size()) +
            " checkpoint(s) of an earlier run:" + names +
            "\nA later --resume auto takes the highest step in the directory: while one of these has a higher "
            "step than this run's newest save, that is what it resumes from, and retention (--keep-last) counts "
            "them as this run's. Remove them or use another --run-dir unless that is what you want.");
  return found;
}

}  // namespace h5ddp

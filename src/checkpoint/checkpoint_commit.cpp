// The commit protocol's file-system steps (fsync, `latest`, retention) and finding the checkpoint to resume from.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint/checkpoint_internal.hpp"
#include "checkpoint/format.hpp"
#include "core/log.hpp"
#include "h5ddp/error.hpp"

namespace fs = std::filesystem;

namespace h5ddp {
namespace ckpt {

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw CheckpointError("cannot open " + path + " to fsync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw CheckpointError("fsync of " + path + " failed: " + std::strerror(err));
}

// run_dir/<name> replaced by `text`: written to <name>.tmp, fsynced, renamed over, directory fsynced. The fault
// phases (test hooks) fire after the write and after the rename.
void replace_pointer_file(const std::string& run_dir, const std::string& name, const std::string& text, bool fsync,
                          const char* written_phase, const char* renamed_phase) {
  const fs::path tmp = fs::path(run_dir) / (name + ".tmp");
  const fs::path target = fs::path(run_dir) / name;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw CheckpointError("cannot write " + tmp.string());
  }
  if (fsync) fsync_path(tmp.string(), false);
  if (written_phase) maybe_inject_fault(written_phase, 0);
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) throw CheckpointError("cannot rename " + tmp.string() + " to " + target.string() + ": " + ec.message());
  if (renamed_phase) maybe_inject_fault(renamed_phase, 0);
  if (fsync) fsync_path(run_dir, true);
}

void write_latest(const std::string& run_dir, const std::string& file_name, bool fsync) {
  // Only rank 0 moves `latest`.
  replace_pointer_file(run_dir, format::kLatestFile, file_name + "\n", fsync, "latest_written", "latest_renamed");
}

// The file name `latest` holds, or "" when it is missing or unreadable.
std::string read_latest(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / format::kLatestFile);
  std::string name;
  if (!in || !std::getline(in, name)) return "";
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
  return name;
}

void apply_retention(const std::string& run_dir, const SaveOptions& options, const std::string& newest) {
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> ckpts;
  std::vector<fs::path> partials;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string n = e.path().filename().string();
    const int64_t step = format::checkpoint_step_from_name(n);
    if (step >= 0) ckpts.emplace_back(step, e.path());
    const std::string suffix = std::string(format::kCheckpointSuffix) + format::kPartialSuffix;
    if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      partials.push_back(e.path());
  }
  if (ec) {
    log::warn("retention: cannot list " + run_dir + ": " + ec.message());
    return;
  }
  // Saves are collective and sequential: any *.partial still here belongs to a save that died.
  for (const auto& p : partials) {
    fs::remove(p, ec);
    if (!ec) log::info("removed stale partial checkpoint " + p.string());
  }
  if (options.keep_last <= 0) return;
  std::sort(ckpts.begin(), ckpts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  const std::string latest = read_latest(run_dir);
  for (size_t i = 0; i < ckpts.size(); ++i) {
    const std::string n = ckpts[i].second.filename().string();
    const bool keep = static_cast<int>(i) < options.keep_last || n == newest || n == latest ||
                      (options.keep_every > 0 && ckpts[i].first % options.keep_every == 0) ||
                      std::find(options.keep_files.begin(), options.keep_files.end(), n) != options.keep_files.end();
    if (keep) continue;
    fs::remove(ckpts[i].second, ec);
    if (ec) log::warn("retention: cannot remove " + ckpts[i].second.string() + ": " + ec.message());
    maybe_inject_fault("mid_retention", 0);  // only rank 0 applies retention
  }
}

}  // namespace ckpt

void write_run_dir_pointer(const std::string& run_dir, const std::string& name, const std::string& text, bool fsync) {
  ckpt::replace_pointer_file(run_dir, name, text, fsync, nullptr, nullptr);
}

ResumeCandidates list_resume_candidates(Comm& comm, const std::string& run_dir) {
  // Rank 0 lists the directory and broadcasts the list. The rename of <name>.partial is the commit point: a
  // kill after it and before `latest` moves leaves a complete file that `latest` does not name yet, so the
  // order is by step, highest first, and `latest` is only a pointer. The one thing `latest` adds is a file
  // whose name carries no step (SaveOptions::name): it goes first, since nothing else dates it.
  std::string listing;
  if (comm.rank() == 0) {
    std::vector<std::pair<int64_t, std::string>> found;
    std::error_code ec;
    if (fs::is_directory(run_dir, ec))
      for (const auto& e : fs::directory_iterator(run_dir, ec)) {
        const std::string n = e.path().filename().string();
        const int64_t step = format::checkpoint_step_from_name(n);
        if (step >= 0) found.emplace_back(step, n);
      }
    std::string latest = ckpt::read_latest(run_dir);
    const std::string partial = std::string(format::kCheckpointSuffix) + format::kPartialSuffix;
    if (latest.size() >= partial.size() &&
        latest.compare(latest.size() - partial.size(), partial.size(), partial) == 0) {
      log::warn("ignoring " + (fs::path(run_dir) / format::kLatestFile).string() + ": it names " + latest +
                ", a partial file (never a checkpoint)");
      latest.clear();
    }
    const int64_t latest_step = latest.empty() ? -1 : format::checkpoint_step_from_name(latest);
    // A step-named target missing from the directory is still listed (by its step): its failed load is the
    // warning that says `latest` is stale.
    if (latest_step >= 0 && std::none_of(found.begin(), found.end(), [&](const auto& f) { return f.second == latest; }))
      found.emplace_back(latest_step, latest);
    std::sort(found.begin(), found.end(), std::greater<>());
    if (!latest.empty() && latest_step < 0) listing += "@" + latest + "\n";  // "@": named by latest
    for (const auto& f : found) listing += (f.second == latest ? "@" : "") + f.second + "\n";
  }
  listing = comm.broadcast_string(listing, 0);

  ResumeCandidates out;
  for (size_t pos = 0; pos < listing.size();) {
    const size_t nl = listing.find('\n', pos);
    std::string name = listing.substr(pos, nl - pos);
    if (name[0] == '@') out.latest_index = static_cast<int>(out.paths.size()), name.erase(0, 1);
    out.paths.push_back((fs::path(run_dir) / name).string());
    pos = nl + 1;
  }
  return out;
}

std::optional<std::string> resume_newest(Comm& comm, const std::string& run_dir,
                                         const std::function<void(const std::string& path)>& attempt) {
  const ResumeCandidates c = list_resume_candidates(comm, run_dir);
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
  const ResumeCandidates c = list_resume_candidates(comm, run_dir);
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

std::optional<std::string> find_resume_checkpoint(MpiComm& comm, const std::string& run_dir) {
  return resume_newest(comm, run_dir, [&](const std::string& path) {
    const auto problems = verify_checkpoint_collective(comm, path);  // the same list on every rank
    if (problems.size() == 1) std::rethrow_exception(ckpt::checkpoint_error(problems.front()));
    if (problems.size() > 1)
      std::rethrow_exception(
          ckpt::checkpoint_error(problems.front() + " (+" + std::to_string(problems.size() - 1) + " more problems)"));
  });
}

}  // namespace h5ddp

// The commit protocol's file-system steps (fsync, `latest`, retention) and finding the checkpoint to resume from.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint_internal.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"

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

void write_latest(const std::string& run_dir, const std::string& file_name, bool fsync) {
  const fs::path tmp = fs::path(run_dir) / format::kLatestTmpFile;
  const fs::path latest = fs::path(run_dir) / format::kLatestFile;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << file_name << "\n";
    out.close();
    if (!out) throw CheckpointError("cannot write " + tmp.string());
  }
  if (fsync) fsync_path(tmp.string(), false);
  std::error_code ec;
  fs::rename(tmp, latest, ec);
  if (ec) throw CheckpointError("cannot rename " + tmp.string() + " to " + latest.string() + ": " + ec.message());
  if (fsync) fsync_path(run_dir, true);
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
                      (options.keep_every > 0 && ckpts[i].first % options.keep_every == 0);
    if (keep) continue;
    fs::remove(ckpts[i].second, ec);
    if (ec) log::warn("retention: cannot remove " + ckpts[i].second.string() + ": " + ec.message());
  }
}

}  // namespace ckpt

ResumeCandidates list_resume_candidates(Comm& comm, const std::string& run_dir) {
  // Rank 0 lists the directory (latest first, then ckpt-<step>.h5 newest first) and broadcasts the list.
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
    std::sort(found.begin(), found.end(), std::greater<>());
    const std::string latest = ckpt::read_latest(run_dir);
    if (!latest.empty()) listing += "@" + latest + "\n";  // "@": named by latest
    for (const auto& f : found)
      if (f.second != latest) listing += f.second + "\n";
  }
  listing = comm.broadcast_string(listing, 0);

  ResumeCandidates out;
  for (size_t pos = 0; pos < listing.size();) {
    const size_t nl = listing.find('\n', pos);
    std::string name = listing.substr(pos, nl - pos);
    if (pos == 0 && name[0] == '@') out.latest_first = true, name.erase(0, 1);
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
    try {
      attempt(c.paths[i]);
      if (!why.empty() && comm.rank() == 0) log::warn("resuming from " + c.paths[i] + " instead:" + why);
      return c.paths[i];
    } catch (const CheckpointMismatchError&) {
      throw;
    } catch (const DisagreementError&) {
      throw;
    } catch (const Error& e) {
      why += "\n  " + std::string(i == 0 && c.latest_first ? "(named by latest) " : "") + e.what();
    }
  }
  if (!why.empty() && comm.rank() == 0)
    log::warn("no valid checkpoint in " + run_dir + ", starting from scratch:" + why);
  return std::nullopt;
}

std::optional<std::string> find_resume_checkpoint(Comm& comm, const std::string& run_dir) {
  return resume_newest(comm, run_dir, [&](const std::string& path) {
    const auto problems = verify_checkpoint_collective(comm, path);  // the same list on every rank
    if (problems.size() == 1) throw CheckpointError(problems.front());
    if (problems.size() > 1)
      throw CheckpointError(problems.front() + " (+" + std::to_string(problems.size() - 1) + " more problems)");
  });
}

}  // namespace h5ddp

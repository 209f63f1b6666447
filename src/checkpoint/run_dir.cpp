// The run directory: listing, resume candidates, the `latest` and `best` pointers, retention.
#include "h5ddp/run_dir.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <utility>

#include "checkpoint/fault_inject.hpp"
#include "checkpoint/fsync.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"

namespace fs = std::filesystem;

namespace h5ddp {

namespace {

bool is_partial_checkpoint(const std::string& n) {
  const std::string suffix = std::string(format::kCheckpointSuffix) + format::kPartialSuffix;
  return n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One pass over the directory: the committed checkpoints (unsorted) and the partial files.
struct Listing {
  std::vector<CheckpointEntry> checkpoints;
  std::vector<std::string> partials;
  std::error_code error;
};

// missing_ok: a missing directory lists nothing (nothing saved yet) instead of being an error.
Listing list_dir(const std::string& dir, bool missing_ok) {
  Listing out;
  std::error_code ec;
  if (missing_ok && !fs::exists(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, out.error)) {
    const std::string n = e.path().filename().string();
    const int64_t step = format::checkpoint_step_from_name(n);
    if (step >= 0) out.checkpoints.push_back(CheckpointEntry{n, step, std::nullopt});
    if (is_partial_checkpoint(n)) out.partials.push_back(n);
  }
  return out;
}

void sort_by_step_descending(std::vector<CheckpointEntry>& entries) {
  std::sort(entries.begin(), entries.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    return a.step != b.step ? a.step > b.step : a.file > b.file;
  });
}

// dir/<name> replaced by `text`: written to <name>.tmp, fsynced, renamed over, directory fsynced. The fault phases
// (test hooks) fire after the write and after the rename.
void replace_pointer_file(const std::string& dir, const std::string& name, const std::string& text, bool fsync,
                          const char* written_phase, const char* renamed_phase) {
  const fs::path tmp = fs::path(dir) / (name + ".tmp");
  const fs::path target = fs::path(dir) / name;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw CheckpointError("cannot write " + tmp.string());
  }
  if (fsync) ckpt::fsync_path(tmp.string(), false);
  if (written_phase) ckpt::maybe_inject_fault(written_phase, 0);
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) throw CheckpointError("cannot rename " + tmp.string() + " to " + target.string() + ": " + ec.message());
  if (renamed_phase) ckpt::maybe_inject_fault(renamed_phase, 0);
  if (fsync) ckpt::fsync_path(dir, true);
}

std::optional<BestPointer> parse_best(const std::string& line) {
  std::istringstream is(line);
  BestPointer b;
  if (!(is >> b.file >> b.value)) return std::nullopt;
  return b;
}

std::string first_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

}  // namespace

RunDir::RunDir(std::string path) : path_(std::move(path)) {}

std::string RunDir::file_path(const std::string& file_name) const {
  return (fs::path(path_) / file_name).string();
}

std::vector<CheckpointEntry> RunDir::checkpoints(std::error_code* error) const {
  Listing l = list_dir(path_, true);
  if (error) *error = l.error;
  sort_by_step_descending(l.checkpoints);
  return l.checkpoints;
}

std::vector<std::string> RunDir::partials(std::error_code* error) const {
  Listing l = list_dir(path_, true);
  if (error) *error = l.error;
  std::sort(l.partials.begin(), l.partials.end());
  return l.partials;
}

std::string RunDir::latest() const {
  std::ifstream in(fs::path(path_) / format::kLatestFile);
  std::string name;
  if (!in || !std::getline(in, name)) return "";
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
  return name;
}

void RunDir::move_latest(const std::string& file_name, bool fsync) const {
  replace_pointer_file(path_, format::kLatestFile, file_name + "\n", fsync, "latest_written", "latest_renamed");
}

std::optional<BestPointer> RunDir::best() const {
  return parse_best(first_line(fs::path(path_) / kBestFile));
}

std::optional<BestPointer> RunDir::best(Comm& comm) const {
  std::string line;
  if (comm.rank() == 0) line = first_line(fs::path(path_) / kBestFile);
  return parse_best(comm.broadcast_string(line, 0));
}

void RunDir::move_best(const std::string& file_name, double value, bool fsync) const {
  char line[512];
  std::snprintf(line, sizeof line, "%s %.6f\n", file_name.c_str(), value);
  write_pointer(kBestFile, line, fsync);
}

void RunDir::write_pointer(const std::string& name, const std::string& text, bool fsync) const {
  replace_pointer_file(path_, name, text, fsync, nullptr, nullptr);
}

ResumeCandidates RunDir::resume_candidates(Comm& comm) const {
  // Rank 0 lists the directory and broadcasts the list. The rename of <name>.partial is the commit point: a
  // kill after it and before `latest` moves leaves a complete file that `latest` does not name yet, so the
  // order is by step, highest first, and `latest` is only a pointer. The one thing `latest` adds is a file
  // whose name carries no step (SaveOptions::name): it goes first, since nothing else dates it.
  std::string listing;
  if (comm.rank() == 0) {
    std::vector<std::pair<int64_t, std::string>> found;
    std::error_code ec;
    if (fs::is_directory(path_, ec))
      for (const auto& e : fs::directory_iterator(path_, ec)) {
        const std::string n = e.path().filename().string();
        const int64_t step = format::checkpoint_step_from_name(n);
        if (step >= 0) found.emplace_back(step, n);
      }
    std::string latest_name = latest();
    const std::string partial = std::string(format::kCheckpointSuffix) + format::kPartialSuffix;
    if (latest_name.size() >= partial.size() &&
        latest_name.compare(latest_name.size() - partial.size(), partial.size(), partial) == 0) {
      log::warn("ignoring " + (fs::path(path_) / format::kLatestFile).string() + ": it names " + latest_name +
                ", a partial file (never a checkpoint)");
      latest_name.clear();
    }
    const int64_t latest_step = latest_name.empty() ? -1 : format::checkpoint_step_from_name(latest_name);
    // A step-named target missing from the directory is still listed (by its step): its failed load is the
    // warning that says `latest` is stale.
    if (latest_step >= 0 &&
        std::none_of(found.begin(), found.end(), [&](const auto& f) { return f.second == latest_name; }))
      found.emplace_back(latest_step, latest_name);
    std::sort(found.begin(), found.end(), std::greater<>());
    if (!latest_name.empty() && latest_step < 0) listing += "@" + latest_name + "\n";  // "@": named by latest
    for (const auto& f : found) listing += (f.second == latest_name ? "@" : "") + f.second + "\n";
  }
  listing = comm.broadcast_string(listing, 0);

  ResumeCandidates out;
  for (size_t pos = 0; pos < listing.size();) {
    const size_t nl = listing.find('\n', pos);
    std::string name = listing.substr(pos, nl - pos);
    if (name[0] == '@') out.latest_index = static_cast<int>(out.paths.size()), name.erase(0, 1);
    out.paths.push_back(file_path(name));
    pos = nl + 1;
  }
  return out;
}

std::vector<std::string> RunDir::apply_retention(const KeepPolicy& policy, const std::string& newest) const {
  std::error_code ec;
  Listing l = list_dir(path_, false);  // right after a save: a missing directory is worth a warning
  if (l.error) {
    log::warn("retention: cannot list " + path_ + ": " + l.error.message());
    return {};
  }
  // Saves are collective and sequential: any *.partial still here belongs to a save that died.
  for (const auto& p : l.partials) {
    const fs::path partial = fs::path(path_) / p;
    fs::remove(partial, ec);
    if (!ec) log::info("removed stale partial checkpoint " + partial.string());
  }
  if (policy.keep_last <= 0) return {};
  if (policy.needs_values())
    for (auto& c : l.checkpoints) {
      try {
        const auto meta = CheckpointFile(file_path(c.file)).meta();
        const auto it = meta.find(policy.best_metric);
        if (it != meta.end()) c.value = parse_metric(it->second);
      } catch (const std::exception& e) {
        log::warn("retention: cannot read /meta of " + file_path(c.file) + " (not counted among the best by " +
                  policy.best_metric + "): " + e.what());
      }
    }
  std::vector<std::string> removed;
  for (const auto& n : policy.files_to_delete(l.checkpoints, {newest, latest()})) {
    const fs::path p = fs::path(path_) / n;
    fs::remove(p, ec);
    if (ec)
      log::warn("retention: cannot remove " + p.string() + ": " + ec.message());
    else
      removed.push_back(n);
    ckpt::maybe_inject_fault("mid_retention", 0);  // only rank 0 applies retention
  }
  return removed;
}

}  // namespace h5ddp

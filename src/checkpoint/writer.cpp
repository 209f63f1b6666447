// save_checkpoint: plan -> agree -> create <name>.partial with MPI-IO -> every rank writes its share -> commit.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "checkpoint/direct_write.hpp"
#include "checkpoint/errors.hpp"
#include "checkpoint/fault_inject.hpp"
#include "checkpoint/fsync.hpp"
#include "checkpoint/hash.hpp"
#include "checkpoint/phase_timer.hpp"
#include "checkpoint/pieces.hpp"
#include "checkpoint/plan.hpp"
#include "checkpoint/rows.hpp"
#include "checkpoint/rules.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/run_dir.hpp"

namespace h5ddp {
namespace {

using ckpt::DatasetPlan;

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Ranks must agree on the structure before anything touches the disk. Replicas are compared here cheaply:
// small datasets by their checksums, tensors by a sample hash (ckpt::sample_hash); the full comparison of
// tensor bytes comes with the checksums, after the writes (collect_checksums).
void agree_on_plan(Comm& comm, const ckpt::SavePlan& plan) {
  if (!comm.agree(plan.structure_hash)) {
    const int world = comm.size();
    uint64_t mine[2] = {plan.structure_hash, plan.datasets.size()};
    std::vector<uint64_t> all(2 * world);
    comm.allgather(mine, all.data(), 2, DType::kU64);
    std::string seen;
    for (int r = 0; r < world; ++r)
      seen += "\n    rank " + std::to_string(r) + ": " + std::to_string(all[2 * r + 1]) + " datasets, structure hash " +
              std::to_string(all[2 * r]);
    throw_agreed(
        DisagreementError("ranks disagree on the checkpoint's datasets (names, dtypes, shapes) or "
                          "attributes; no file written:" +
                          seen));
  }
  // Replicas compared by their sample hashes: every rank's copy of a replicated dataset, and the copies of a
  // sharded whole entry that several ranks hold (Adam's step of a split parameter); a rank without a copy takes
  // no part (min over UINT64_MAX, max over 0). A shard or a row piece has no replicas.
  std::vector<uint64_t> lo, hi;
  for (const auto& d : plan.datasets) {
    const bool copies = d.owner >= 0 && d.holders.size() > 1;
    const bool holds = std::find(d.holders.begin(), d.holders.end(), comm.rank()) != d.holders.end();
    uint64_t h = 0;
    if (copies && holds && d.src)
      h = ckpt::sample_hash(d.src, d.nbytes());
    else if (d.owner < 0 && d.pieces.empty())
      h = d.tensor ? ckpt::sample_hash(d.src, d.nbytes()) : d.checksum;
    lo.push_back(copies && !holds ? UINT64_MAX : h);
    hi.push_back(copies && !holds ? 0 : h);
  }
  comm.allreduce(lo.data(), lo.size(), DType::kU64, ReduceOp::kMin);
  comm.allreduce(hi.data(), hi.size(), DType::kU64, ReduceOp::kMax);
  std::string differ;
  for (size_t i = 0; i < lo.size(); ++i)
    if (lo[i] != hi[i]) differ += "\n    " + plan.datasets[i].path;
  if (!differ.empty())
    throw_agreed(
        DisagreementError("replicated state differs between ranks (checksums disagree); no file written:" + differ));
}

// Which rank's hash of each dataset becomes its checksum: the rank that wrote it whole, or kEveryRank (a
// dataset split between ranks, an empty one, a small one, or every tensor under verify_replicas): then every
// rank hashed its own copy and the hashes must agree.
constexpr int kEveryRank = -1;
constexpr int kChained = -2;  // split in row pieces: chained_hashes computes the checksum
std::vector<int> checksum_owners(const ckpt::SavePlan& plan, const std::vector<ckpt::Segment>& segments,
                                 const std::vector<int>& pieces, bool verify_replicas) {
  std::vector<int> owner(plan.datasets.size(), kEveryRank);
  if (!verify_replicas)
    for (const auto& s : segments)
      if (plan.datasets[s.index].tensor && pieces[s.index] == 1) owner[s.index] = s.rank;
  for (size_t i = 0; i < plan.datasets.size(); ++i)
    if (plan.datasets[i].owner >= 0)
      owner[i] = plan.datasets[i].owner;  // a shard: only its rank has the bytes
    else if (!plan.datasets[i].pieces.empty())
      owner[i] = kChained;
  return owner;
}

// Collective. Sets every tensor dataset's checksum from its owner's hash (kEveryRank: all ranks' hashes,
// which must be equal: the bytes written from different ranks' replicas must be the same bytes).
void collect_checksums(Comm& comm, ckpt::SavePlan& plan, const std::vector<int>& owner,
                       const std::vector<uint64_t>& hashed) {
  const int rank = comm.rank();
  std::vector<uint64_t> lo(plan.datasets.size()), hi(plan.datasets.size());
  for (size_t i = 0; i < plan.datasets.size(); ++i) {
    const bool mine = owner[i] == kEveryRank || owner[i] == rank;
    const uint64_t h = plan.datasets[i].tensor ? hashed[i] : plan.datasets[i].checksum;
    lo[i] = mine ? h : UINT64_MAX;
    hi[i] = mine ? h : 0;
  }
  comm.allreduce(lo.data(), lo.size(), DType::kU64, ReduceOp::kMin);
  comm.allreduce(hi.data(), hi.size(), DType::kU64, ReduceOp::kMax);
  std::string differ;
  for (size_t i = 0; i < lo.size(); ++i) {
    if (lo[i] != hi[i]) differ += "\n    " + plan.datasets[i].path;
    plan.datasets[i].checksum = lo[i];
  }
  if (!differ.empty())
    throw_agreed(
        DisagreementError("replicated state differs between ranks (full checksums disagree); the partial file "
                          "is removed and nothing is committed:" +
                          differ));
}

void write_root_attributes(hid_t f, const TrainState& state, int world) {
  h5::write_attr(f, format::kAttrFormat, std::string(format::kFormatName));
  h5::write_attr(f, format::kAttrFormatVersion, static_cast<int64_t>(format::kFormatVersion));
  h5::write_attr(f, format::kAttrFormatMinorVersion, ckpt::kFormatMinorVersion);
  h5::write_attr(f, format::kAttrH5ddpVersion, std::string(H5DDP_VERSION_STRING));
  auto tv = state.meta.find("torch_version");
  h5::write_attr(f, format::kAttrTorchVersion, tv == state.meta.end() ? std::string("unknown") : tv->second);
  h5::write_attr(f, format::kAttrCreated, utc_now());
  h5::write_attr(f, format::kAttrWorldSize, static_cast<int64_t>(world));
  h5::write_attr(f, format::kAttrStep, static_cast<int64_t>(state.counters.step));
}

// The parallel file system settings of a save as /meta records them (FORMAT.md "Meta").
constexpr const char* kMetaMpiioHints = "mpiio_hints";
constexpr const char* kMetaAlignment = "h5_alignment";
std::string joined_hints(const MpiioHints& hints) {
  std::string out;
  for (const auto& [k, v] : hints) out += (out.empty() ? "" : ";") + k + "=" + v;
  return out;
}

void write_groups(hid_t f, const TrainState& state, const SaveOptions& options) {
  for (const char* g : {format::kModelGroup, format::kOptimizerGroup, format::kParamGroupsGroup,
                        format::kOptimizerStateGroup, format::kTrainGroup, format::kDataGroup, format::kRngGroup})
    h5::create_group(f, g);
  if (!state.user.empty()) h5::create_group(f, format::kUserGroup);
  {
    h5::Handle opt = h5::group(H5Gopen2(f, format::kOptimizerGroup, H5P_DEFAULT));
    h5::write_attr(opt, format::kAttrOptimizerType, state.optimizer.type);
  }
  for (size_t i = 0; i < state.optimizer.groups.size(); ++i) {
    h5::Handle g = h5::create_group(f, format::param_group_path(i));
    for (const auto& [k, v] : state.optimizer.groups[i].hyper) h5::write_attr(g, k, v);
  }
  h5::Handle sched = h5::create_group(f, format::kSchedulerGroup);
  h5::write_attr(sched, format::kAttrSchedulerType, state.scheduler.type);
  for (const auto& [k, v] : state.scheduler.values) h5::write_attr(sched, k, v);
  h5::Handle meta = h5::create_group(f, format::kMetaGroup);
  for (const auto& [k, v] : state.meta)
    if (k != kMetaMpiioHints && k != kMetaAlignment) h5::write_attr(meta, k, v);  // a loaded file's: replaced
  h5::write_attr(meta, kMetaMpiioHints, joined_hints(options.mpiio_hints));
  h5::write_attr(meta, kMetaAlignment, std::to_string(options.alignment));
}

h5::Handle create_dataset(hid_t f, const DatasetPlan& d) {
  h5::Handle lcpl = h5::plist(H5Pcreate(H5P_LINK_CREATE));
  H5DDP_CHECK_H5(H5Pset_create_intermediate_group(lcpl, 1));
  h5::Handle dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
  // Parallel HDF5 allocates contiguous storage at creation; never spend a pass writing fill values.
  H5DDP_CHECK_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  h5::Handle type = d.file_type();
  h5::Handle space = h5::make_space(d.shape);
  h5::Handle ds = h5::dataset(H5Dcreate2(f, d.path.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT));
  h5::write_attr(ds, format::kAttrDtype, std::string(d.string_size ? "string" : dtype_name(d.dtype)));
  return ds;  // the checksum attribute comes after the data (collect_checksums)
}

// Writes rows [begin, end) of `d` in max(min_calls, transfer_count) calls (collective transfers: every rank
// must make the same number of calls).
void write_rows(hid_t ds, const DatasetPlan& d, uint64_t begin, uint64_t end, hid_t dxpl, size_t min_calls = 0) {
  with_context("writing rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + d.path, [&] {
    h5::Handle type = d.file_type();
    h5::Handle fspace = h5::dataspace(H5Dget_space(ds));
    const uint64_t per = std::max<uint64_t>(1, d.row_bytes() ? ckpt::max_transfer_bytes() / d.row_bytes() : 1);
    const size_t calls = std::max<size_t>({min_calls, ckpt::transfer_count(d, begin, end), 1});
    // The memory space is src's rows [src_row, src_row + held): all rows, or this rank's piece.
    std::vector<int64_t> held = d.shape;
    if (!held.empty() && !d.pieces.empty())
      held[0] = static_cast<int64_t>(std::max<uint64_t>(end, d.src_row + 1) - d.src_row);
    h5::Handle mspace = h5::make_space(held);
    static const char kNothing = 0;  // a rank with no rows passes a valid pointer all the same
    const void* src = d.src ? d.src : &kNothing;
    for (size_t i = 0; i < calls; ++i) {
      const uint64_t b = std::min(end, begin + i * per), e = std::min(end, b + per);
      ckpt::select_rows(fspace, d.shape, b, e);
      ckpt::select_rows(mspace, held, b - std::min(b, d.src_row), e - std::min(b, d.src_row));
      H5DDP_CHECK_H5(H5Dwrite(ds, type, mspace, fspace, dxpl, src));
    }
  });
}

// Starts the disk writing a rank's rows as soon as they are in the page cache (sync_file_range
// SYNC_FILE_RANGE_WRITE: initiates write-out, does not wait for it), so that writeback overlaps the copying of
// the rest instead of all of it waiting for the fsync of the commit. The fsync stays: this only moves work
// earlier, the commit protocol is unchanged. Off without fsync (nothing waits for the disk then), for datasets
// whose storage HDF5 has not placed contiguously, and with H5DDP_EARLY_WRITEBACK=0 (benchmarks' A/B).
class EarlyWriteback {
 public:
  EarlyWriteback(const std::string& path, bool enabled) {
    const char* e = std::getenv("H5DDP_EARLY_WRITEBACK");
    if (enabled && !(e && std::string(e) == "0")) fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  }
  ~EarlyWriteback() {
    if (fd_ >= 0) ::close(fd_);
  }
  EarlyWriteback(const EarlyWriteback&) = delete;
  EarlyWriteback& operator=(const EarlyWriteback&) = delete;
  // Rows [begin, end) of dataset `ds` were just written by this rank.
  void rows_written(hid_t ds, const DatasetPlan& d, uint64_t begin, uint64_t end) {
    if (fd_ < 0 || end <= begin) return;
    const haddr_t offset = H5Dget_offset(ds);
    if (offset == HADDR_UNDEF) return;
    const uint64_t from = offset + begin * d.row_bytes(), n = (end - begin) * d.row_bytes();
    ::sync_file_range(fd_, static_cast<off64_t>(from), static_cast<off64_t>(n), SYNC_FILE_RANGE_WRITE);  // a hint
  }

 private:
  int fd_ = -1;
};

// What one save carries from phase to phase on this rank. Members in the order they are made: the hasher
// reads the caller's tensors and waits for its work when destroyed, before the plan goes.
struct SaveJob {
  SaveJob(MpiComm& c, const TrainState& s, const std::string& dir, const SaveOptions& o)
      : comm(c), state(s), run_dir(dir), options(o), rank(c.rank()), world(c.size()) {}
  MpiComm& comm;
  const TrainState& state;
  const std::string& run_dir;
  const SaveOptions& options;
  const int rank, world;
  ckpt::PhaseTimer timer;
  ckpt::SavePlan plan;
  std::vector<ckpt::Segment> segments;
  std::vector<int> pieces;  // segments per dataset: >= 2 means split between ranks
  std::vector<int> owner;   // whose hash becomes each dataset's checksum (checksum_owners)
  std::unique_ptr<ckpt::BackgroundHasher> hasher;
  std::string name, final_path, partial_path;
  SaveResult result;
  h5::Handle file;
  std::vector<h5::Handle> dsets;
};

// run_dir/<name>: SaveOptions::name or ckpt-<step>.h5, with ".h5" added when missing.
void name_files(SaveJob& job) {
  job.name = job.options.name.empty() ? format::checkpoint_file_name(job.state.counters.step) : job.options.name;
  if (job.name.size() < 3 || job.name.compare(job.name.size() - 3, 3, format::kCheckpointSuffix) != 0)
    job.name += format::kCheckpointSuffix;
  job.final_path = (std::filesystem::path(job.run_dir) / job.name).string();
  job.partial_path = job.final_path + format::kPartialSuffix;
}

// Collective. Disk full is a clean, agreed error before any HDF5 call (issue 9): after an ENOSPC inside HDF5,
// ranks can take different paths through the collective close and hang. Margin: metadata, alignment.
// H5DDP_SKIP_SPACE_CHECK=1 lets the fault tests reach ENOSPC inside HDF5: a test-only hook, armed only with
// H5DDP_TEST_HOOKS=1 as well, so a stray variable cannot take the check away from a real run.
void check_space(SaveJob& job) {
  std::string space_error;
  const char* hooks = std::getenv("H5DDP_TEST_HOOKS");
  const bool skip_space_check = hooks && std::string(hooks) == "1" && std::getenv("H5DDP_SKIP_SPACE_CHECK") != nullptr;
  if (job.rank == 0 && !skip_space_check) {
    std::error_code ec;
    const auto sp = std::filesystem::space(job.run_dir, ec);
    const uint64_t needed = job.result.bytes + job.result.bytes / 16 + (1u << 20);
    if (!ec && sp.available < needed)
      space_error = "not enough space for " + job.partial_path + ": needs about " + std::to_string(needed) +
                    " bytes, " + std::to_string(sp.available) + " available (disk full?)";
  }
  job.comm.rethrow_first(ckpt::checkpoint_error(space_error));
}

// docs/FORMAT.md's rules on the file this job would write ("" or why it is refused): a writer writes only valid
// files. Each rank checks the Adam steps it holds (all of them unless the optimizer state is sharded).
std::string state_problems(const SaveJob& job) {
  auto problems = ckpt::rule_problems(ckpt::facts_of_plan(job.plan, job.state, job.world, job.final_path), nullptr);
  ckpt::FileValues v;
  v.root_step = job.state.counters.step;
  v.counters = job.state.counters;
  v.data = job.state.data;
  v.adam_steps = ckpt::adam_steps(job.plan.optimizer.state);
  for (auto& p : ckpt::value_problems(job.final_path, v)) problems.push_back(std::move(p));
  if (problems.empty()) return "";
  return "refusing to write " + job.final_path + ": the file would not be a valid checkpoint:\n  " +
         ckpt::joined_problems(problems);
}

// Phase "plan" (collective, nothing on disk yet): agree on the step and the plan, start hashing the tensors,
// check the run directory and the free space.
void plan_save(SaveJob& job) {
  job.comm.require_same(job.state.counters.step, "checkpoint step");
  // Different alignments would give ranks different layouts of one file (collective metadata must match).
  job.comm.require_same(static_cast<int64_t>(std::hash<std::string>{}(joined_hints(job.options.mpiio_hints) + "|" +
                                                                      std::to_string(job.options.alignment))),
                        "MPI-IO hints and alignment (SaveOptions::mpiio_hints, alignment)");
  job.plan = ckpt::make_save_plan(job.comm, job.state);
  agree_on_plan(job.comm, job.plan);

  // Tensor checksums are computed on a background thread while the data is written: each rank hashes what
  // it writes (or everything, with verify_replicas), so hashing costs neither a pass before the writes nor
  // N copies of the work.
  const auto& datasets = job.plan.datasets;
  job.segments = ckpt::compute_segments(datasets, job.world);
  job.pieces.assign(datasets.size(), 0);
  for (const auto& s : job.segments) ++job.pieces[s.index];
  job.owner = checksum_owners(job.plan, job.segments, job.pieces, job.options.verify_replicas);
  job.hasher = std::make_unique<ckpt::BackgroundHasher>(datasets.size());
  for (size_t i = 0; i < datasets.size(); ++i)
    if (datasets[i].tensor && (job.owner[i] == kEveryRank || job.owner[i] == job.rank))
      job.hasher->submit(i, datasets[i].src, datasets[i].nbytes());
  job.timer.mark("plan+agree");

  name_files(job);
  job.comm.rethrow_first(ckpt::checkpoint_error(state_problems(job)));
  job.comm.rethrow_first(
      ckpt::checkpoint_error(job.rank == 0 && !std::filesystem::is_directory(job.run_dir)
                                 ? "run directory '" + job.run_dir + "' does not exist or is not a directory"
                                 : ""));
  job.result.path = job.final_path;
  for (const auto& d : datasets) job.result.bytes += d.nbytes();
  check_space(job);
}

// Phase "create" (collective): <name>.partial with MPI-IO, root attributes, groups, every dataset.
void create_partial(SaveJob& job) {
  job.comm.rethrow_first(ckpt::checkpoint_error_of([&] {
    with_context("creating " + job.partial_path, [&] {
      h5::MpioOptions mpio;
      mpio.alignment = mpio.alignment_threshold = job.options.alignment;
      mpio.hints = job.options.mpiio_hints;
      h5::Handle fapl = h5::mpio_file_access(job.comm.handle(), mpio);
      h5::SilenceErrors quiet;
      job.file = h5::file(H5Fcreate(job.partial_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
      write_root_attributes(job.file, job.state, job.world);
      write_groups(job.file, job.state, job.options);
      for (const auto& d : job.plan.datasets) job.dsets.push_back(create_dataset(job.file, d));
    });
  }));
  job.timer.mark("create");
  ckpt::maybe_inject_fault("before_data", job.rank);
}

// Datasets split between ranks, collectively (all ranks call, in plan order, even after an error: other ranks
// are in them). Returns this rank's first error ("" when none).
std::string write_split_datasets(SaveJob& job, EarlyWriteback& writeback) {
  std::string error;
  h5::Handle coll = h5::transfer(true);
  for (size_t i = 0; i < job.plan.datasets.size(); ++i) {
    if (job.pieces[i] < 2) continue;
    const DatasetPlan& d = job.plan.datasets[i];
    uint64_t begin = 0, end = 0;
    size_t calls = 0;  // the most any rank needs: collective calls must match
    for (const auto& s : job.segments) {
      if (s.index != i) continue;
      calls = std::max(calls, ckpt::transfer_count(d, s.row_begin, s.row_end));
      if (s.rank == job.rank) begin = s.row_begin, end = s.row_end;
    }
    std::string e = ckpt::capture_error([&] {
      h5::SilenceErrors quiet;
      write_rows(job.dsets[i], d, begin, end, coll, calls);
      H5D_mpio_actual_io_mode_t mode = H5D_MPIO_NO_COLLECTIVE;
      H5DDP_CHECK_H5(H5Pget_mpio_actual_io_mode(coll, &mode));
      if (mode != H5D_MPIO_NO_COLLECTIVE) ++job.result.collective_writes;
      writeback.rows_written(job.dsets[i], d, begin, end);
    });
    if (error.empty()) error = e;
  }
  return error;
}

// The rest of this rank's share, independently (ranks never wait on each other dataset by dataset); stops at
// the first error. The mid_data fault fires once half of this rank's bytes are written.
std::string write_own_segments(SaveJob& job, EarlyWriteback& writeback, std::string error) {
  h5::Handle indep = h5::transfer(false);
  uint64_t written = 0;
  bool mid_fault_checked = false;
  for (const auto& s : job.segments) {
    if (s.rank != job.rank || job.pieces[s.index] >= 2 || !error.empty()) continue;
    const DatasetPlan& d = job.plan.datasets[s.index];
    error = ckpt::capture_error([&] {
      h5::SilenceErrors quiet;
      write_rows(job.dsets[s.index], d, s.row_begin, s.row_end, indep);
      writeback.rows_written(job.dsets[s.index], d, s.row_begin, s.row_end);
    });
    ++job.result.independent_writes;
    written += (s.row_end - s.row_begin) * d.row_bytes();
    if (!mid_fault_checked && 2 * written >= job.result.bytes_this_rank) {
      mid_fault_checked = true;
      ckpt::maybe_inject_fault("mid_data", job.rank);
    }
  }
  if (!mid_fault_checked) ckpt::maybe_inject_fault("mid_data", job.rank);
  return error;
}

// WriteMode::kDirect: this rank's rows of every dataset it writes (those split between ranks too: the rows are
// disjoint, so no collective is needed) with pwrite around the page cache, at the offsets HDF5 gave the datasets
// when it created them (parallel HDF5 allocates contiguous storage at creation; datasets of 1 MiB and more start
// on 1 MiB boundaries, so their blocks line up with an arena's pages). Returns this rank's error ("" when none).
// The mid_data fault fires once half of this rank's bytes are written.
std::string write_direct(SaveJob& job) {
  return ckpt::capture_error([&] {
    std::vector<ckpt::WriteExtent> extents;
    for (const auto& s : job.segments) {
      const DatasetPlan& d = job.plan.datasets[s.index];
      const uint64_t from = s.row_begin * d.row_bytes(), n = (s.row_end - s.row_begin) * d.row_bytes();
      if (s.rank != job.rank || n == 0) continue;
      const haddr_t at = H5Dget_offset(job.dsets[s.index]);
      if (at == HADDR_UNDEF)
        throw CheckpointError(job.partial_path + ": HDF5 gave " + d.path + " no contiguous storage to write into");
      extents.push_back({at + from, n, static_cast<const char*>(d.src) + (s.row_begin - d.src_row) * d.row_bytes(),
                         d.path + " rows [" + std::to_string(s.row_begin) + ", " + std::to_string(s.row_end) + ")"});
    }
    bool mid_fault_checked = false;
    auto progress = [&](uint64_t done) {
      if (mid_fault_checked || 2 * done < job.result.bytes_this_rank) return;
      mid_fault_checked = true;
      ckpt::maybe_inject_fault("mid_data", job.rank);
    };
    const auto r =
        ckpt::write_extents_direct(job.partial_path, extents, progress, ckpt::refuse_direct_for_tests(job.rank));
    if (!mid_fault_checked) ckpt::maybe_inject_fault("mid_data", job.rank);
    job.result.direct_bytes = r.direct_bytes;
    job.result.independent_writes = static_cast<int>(extents.size());
  });
}

// Phase "write" (collective): every rank writes its share, as SaveOptions::write_mode says.
void write_shares(SaveJob& job) {
  for (const auto& s : job.segments)
    if (s.rank == job.rank)
      job.result.bytes_this_rank += (s.row_end - s.row_begin) * job.plan.datasets[s.index].row_bytes();
  std::string error;
  if (job.options.write_mode == WriteMode::kMpiio) {
    EarlyWriteback writeback(job.partial_path, job.options.fsync);
    error = write_split_datasets(job, writeback);
    error = write_own_segments(job, writeback, std::move(error));
  } else {
    error = write_direct(job);
  }
  job.comm.rethrow_first(ckpt::checkpoint_error(error.empty() ? "" : error + "\n  while writing " + job.partial_path));
  job.timer.mark("write");
}

// Collective. The checksums of the datasets split in row pieces (ckpt::chained_hashes): each becomes the hash of
// the rank holding its last piece.
void chain_piece_hashes(SaveJob& job, std::vector<uint64_t>& hashed) {
  std::vector<ckpt::HashPiece> pieces;
  for (const auto& s : job.segments) {
    const DatasetPlan& d = job.plan.datasets[s.index];
    if (d.pieces.empty()) continue;
    const char* data =
        s.rank == job.rank ? static_cast<const char*>(d.src) + (s.row_begin - d.src_row) * d.row_bytes() : nullptr;
    pieces.push_back({s.index, s.rank, s.row_begin * d.row_bytes(), s.row_end * d.row_bytes(), data});
    job.owner[s.index] = s.rank;  // segments are in row order: the last one holds the last piece
  }
  if (pieces.empty()) return;
  for (const auto& [index, hash] : ckpt::chained_hashes(job.comm, std::move(pieces))) hashed[index] = hash;
  job.timer.mark("chained-hashes");
}

// Phase "checksums" (collective): the tensors' checksums agreed from the hashes, written as attributes.
void write_checksums(SaveJob& job) {
  std::vector<uint64_t> hashed = job.hasher->finish();
  chain_piece_hashes(job, hashed);
  collect_checksums(job.comm, job.plan, job.owner, hashed);
  job.comm.rethrow_first(ckpt::checkpoint_error_of([&] {
    with_context("writing the checksums of " + job.partial_path, [&] {
      h5::SilenceErrors quiet;
      for (size_t i = 0; i < job.plan.datasets.size(); ++i)
        h5::write_attr(job.dsets[i], format::kAttrChecksum, job.plan.datasets[i].checksum);
    });
  }));
  job.timer.mark("checksums");
}

// Phase "close" (collective): the collective close, then every rank fsyncs the file.
void close_partial(SaveJob& job) {
  job.comm.rethrow_first(ckpt::checkpoint_error_of([&] {
    with_context("closing " + job.partial_path, [&] {
      job.dsets.clear();
      job.file.close();
    });
  }));
  job.timer.mark("close");
  if (job.options.fsync)
    job.comm.rethrow_first(ckpt::checkpoint_error_of([&] { ckpt::fsync_path(job.partial_path, false); }));
  job.timer.mark("fsync");
}

// Collective, after an agreed error of a phase between create and close (every rank is here).
void remove_partial(SaveJob& job) {
  // Space may have run out while writing (ENOSPC): give the partial file's blocks back first, so that the
  // metadata flush of the collective close succeeds on every rank instead of failing on some (a hang).
  if (job.rank == 0 && job.file.valid()) ::truncate(job.partial_path.c_str(), 0);
  job.comm.barrier();
  job.dsets.clear();
  job.file = h5::Handle();  // collective close: every rank is here (errors are agreed before we throw)
  if (job.rank == 0) std::filesystem::remove(job.partial_path);
}

// Phase "commit" (collective): rank 0 renames <name>.partial to <name> (the commit point) and fsyncs the
// directory, moves `latest`, applies retention; every rank returns with the directory in its final state.
void commit(SaveJob& job) {
  ckpt::maybe_inject_fault("before_rename", job.rank);
  std::string error;
  if (job.rank == 0) {
    error = ckpt::capture_error([&] {
      std::error_code ec;
      std::filesystem::rename(job.partial_path, job.final_path, ec);
      if (ec)
        throw CheckpointError("cannot rename " + job.partial_path + " to " + job.final_path + ": " + ec.message());
      if (job.options.fsync) ckpt::fsync_path(job.run_dir, true);
    });
    if (!error.empty()) std::filesystem::remove(job.partial_path);
  }
  job.comm.rethrow_first(ckpt::checkpoint_error(error));

  ckpt::maybe_inject_fault("before_latest", job.rank);
  if (job.rank == 0 && job.options.update_latest)
    error = ckpt::capture_error([&] { RunDir(job.run_dir).move_latest(job.name, job.options.fsync); });
  job.comm.rethrow_first(ckpt::checkpoint_error(error));

  if (job.rank == 0) RunDir(job.run_dir).apply_retention(job.options.retention, job.name);  // logs, never throws
  job.comm.barrier();
  job.timer.mark("commit");
}

}  // namespace

std::pair<std::string, std::string> parse_mpiio_hint(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw std::invalid_argument("MPI-IO hint '" + text + "' is not key=value (e.g. striping_factor=16)");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

SaveResult save_checkpoint(MpiComm& comm, const TrainState& state, const std::string& run_dir,
                           const SaveOptions& options) {
  SaveJob job(comm, state, run_dir, options);
  plan_save(job);  // nothing on disk yet
  try {            // the phases that hold <name>.partial: any error, agreed on every rank, removes it
    create_partial(job);
    write_shares(job);
    write_checksums(job);
    close_partial(job);
  } catch (...) {
    remove_partial(job);
    throw;
  }
  commit(job);
  log::debug("save " + job.final_path + ":" + job.timer.timeline() +
             " direct_bytes=" + std::to_string(job.result.direct_bytes));
  job.result.seconds = job.timer.total_seconds();
  return job.result;
}

}  // namespace h5ddp

// TrainState <-> one parallel HDF5 file (docs/FORMAT.md). Torch-free: tensors arrive as TensorRef views.
// save: plan -> agree -> create <name>.h5.partial with MPI-IO -> every rank writes its share -> close ->
// fsync -> rename -> fsync dir -> move `latest` -> retention. load: manifest -> compare with the caller's
// refs -> read (share + exchange, or every rank reads all) -> verify checksums.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "h5ddp/comm.hpp"
#include "h5ddp/policy.hpp"
#include "h5ddp/train_state.hpp"

namespace h5ddp {

// The functions that do MPI-IO take the MpiComm whose communicator the file is opened on (h5ddp/mpi_comm.hpp);
// the others only agree and broadcast, over any Comm.
class MpiComm;

// How each rank's share of the tensor bytes reaches the file (docs/DESIGN.md, "Writes around the page cache").
enum class WriteMode {
  kAuto,    // kDirect: chosen by measurement (docs/BENCHMARKS.md, "Async saves end to end")
  kDirect,  // each rank pwrites its rows with O_DIRECT (no page-cache pages; its edges and where the file
            // system refuses O_DIRECT, through the page cache); HDF5 writes only the metadata
  kMpiio,   // H5Dwrite through MPI-IO and the page cache; datasets split between ranks collectively
};

// MPI_Info hints (key, value) for MPI_File_open, applied over h5ddp's own (cb_buffer_size=16777216,
// romio_ds_write=disable, romio_cb_write=automatic, romio_cb_read=automatic): what a Lustre or GPFS user sets,
// e.g. striping_factor, striping_unit, cb_nodes, romio_cb_write. MPI ignores keys it does not know.
// docs/SCALING.md "Settings".
using MpiioHints = std::vector<std::pair<std::string, std::string>>;
// "key=value" -> (key, value); std::invalid_argument naming `text` when it has no '=' or an empty key.
std::pair<std::string, std::string> parse_mpiio_hint(const std::string& text);

struct SaveOptions {
  bool fsync = true;  // fsync the file (every rank) and the directory before and after the rename
  // What retention keeps after the commit (h5ddp/policy.hpp): the keep_last newest ckpt-<step>.h5, every
  // keep_every-th step, keep_files, the keep_best best by /meta[best_metric]. Default: keep_last 0, keep all.
  KeepPolicy retention;
  std::string name;  // file name in run_dir; default "ckpt-%08lld.h5" of counters.step (".h5" added if missing)
  bool update_latest = true;  // move run_dir/latest to this file
  // Replicated tensors must be identical on all ranks. By default each tensor is hashed in full by the one
  // rank that writes it (its checksum), and ranks compare a sample of every tensor (16 blocks of 4 KiB, all
  // of a tensor up to 64 KiB) before writing. true: every rank hashes every tensor in full and all hashes
  // must agree (N times the hashing work; overlapped with the writes, like the default's).
  bool verify_replicas = false;
  WriteMode write_mode = WriteMode::kAuto;
  // Parallel file system settings (docs/SCALING.md "Settings"); ranks must agree (an agreed error otherwise).
  // Both are recorded in the file: /meta `mpiio_hints` (the hints given, "key=value;..."), `h5_alignment`.
  MpiioHints mpiio_hints;
  // Datasets of at least this many bytes start on a multiple of it (H5Pset_alignment): a stripe boundary on a
  // parallel file system; >= 4096 lets O_DIRECT writes skip the bounce buffer. 0: HDF5's packing, no alignment.
  uint64_t alignment = uint64_t{1} << 20;
};

struct SaveResult {
  std::string path;              // committed file
  uint64_t bytes = 0;            // tensor bytes written by all ranks together
  uint64_t bytes_this_rank = 0;  // tensor bytes this rank wrote
  double seconds = 0;            // wall time of the whole save on this rank
  int collective_writes = 0;     // datasets written with a collective transfer that HDF5 confirmed collective
  int independent_writes = 0;    // datasets (or parts) this rank wrote independently
  uint64_t direct_bytes = 0;     // tensor bytes this rank wrote with O_DIRECT (WriteMode::kDirect)
};

// Collective. Writes run_dir/<name>.partial with MPI-IO, commits it (close, fsync, rename, fsync dir), moves
// run_dir/latest atomically, then applies retention. Every rank contributes its own state.rng as row `rank`
// of /rng. Ranks must agree on step and on every dataset's name/dtype/shape, and replicated tensors must be
// bit-identical on all ranks (checked as SaveOptions::verify_replicas says); otherwise DisagreementError on
// every rank and nothing committed (no file, or the partial file removed). I/O errors:
// CheckpointError/H5Error on every rank, the partial file removed, previous checkpoint and latest untouched.
SaveResult save_checkpoint(MpiComm& comm, const TrainState& state, const std::string& run_dir,
                           const SaveOptions& options = {});

struct TensorInfo {
  std::string name;  // state-dict key (model) or "<param>/<key>" (optimizer state)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t checksum = 0;
  size_t nbytes() const;
};

struct CheckpointManifest {
  std::string path;
  int format_version = 0;
  int64_t step = 0;
  int world_size = 0;
  std::string h5ddp_version, torch_version, created;
  std::string optimizer_type;
  std::vector<ParamGroup> param_groups;
  std::vector<TensorInfo> model, optimizer_state;  // in name order
  std::vector<TensorInfo> user;                    // /user/<name> (Checkpointer::track), in name order
  size_t rng_cpu_bytes = 0, rng_cuda_bytes = 0;    // per rank
  uint64_t tensor_bytes = 0;                       // model + optimizer state
};

// Collective. Rank 0 reads the metadata (and the small datasets) and broadcasts them: the other ranks do not open
// the file. Throws the same CheckpointError on every rank, naming the file, for a non-HDF5 file, a non-h5ddp file,
// an unsupported format version or a file that breaks a rule of docs/FORMAT.md. A load that needs the manifest to
// allocate its destinations takes it from load_checkpoint's `destinations` callback instead (one open).
CheckpointManifest read_manifest(MpiComm& comm, const std::string& path);

enum class LoadStrategy {
  kShareExchange,   // each rank reads a contiguous share of the bytes, then ranks broadcast what they read
  kEveryRankReads,  // every rank reads every byte itself
};

struct LoadOptions {
  bool verify_checksums = true;
  // Default chosen by measurement (docs/DEFAULTS.md "Load strategy"): on one node, where all ranks share
  // one page cache and disk, every rank reading was as fast or faster than share + exchange at 1-4 ranks.
  // Share + exchange cuts file-system reads N-fold, which should win on a parallel FS across many nodes.
  LoadStrategy strategy = LoadStrategy::kEveryRankReads;
  // Every-rank-reads only: read the tensors' bytes with O_DIRECT (around the page cache), four reads in flight,
  // checksums computed while the next bytes arrive. kAuto: on when this rank is the only rank of `comm` on its
  // host (ranks on one host share the page cache, so there the file is read from storage once, not once per
  // rank); H5DDP_DIRECT_IO=0 or 1 in the environment overrides kAuto. Falls back to the page cache where the
  // file system refuses O_DIRECT. Measurements: docs/DESIGN.md "Loads read around the page cache".
  enum class DirectIo { kAuto, kOff, kOn };
  DirectIo direct_io = DirectIo::kAuto;
  MpiioHints mpiio_hints;  // as SaveOptions::mpiio_hints (e.g. cb_nodes, romio_cb_read)
};

// Collective. Verifies format version, checksums, and that state.model / state.optimizer.state refs match the
// file exactly (missing key, extra key, shape, dtype: ONE CheckpointMismatchError listing ALL differences,
// naming the file, dataset and rank; every other problem of the file is a CheckpointError); then fills the
// refs' memory, counters, data, scheduler, optimizer groups/type, rng_by_rank (and rng = row `rank` when
// rank < saved world size), saved_world_size, meta.
// On error, the refs' memory may have been partly overwritten.
void load_checkpoint(MpiComm& comm, const std::string& path, TrainState& state, const LoadOptions& options = {});

// Collective. The same load in one descent: opens the file once, reads its manifest once (errors as
// read_manifest), then asks the caller where the bytes go: destinations(manifest) is called once on every
// rank and returns the TrainState whose refs are compared and filled as above (it may allocate, e.g. the
// optimizer state the manifest lists; a collective inside it must be one every rank completes or leaves by
// the same exception, e.g. Comm::raise_if_any). The TrainState must outlive the call. An exception from
// destinations on any rank is raised on every rank (Comm::rethrow_first: the lowest failing rank's error, of
// its type) and nothing is read.
using LoadDestinations = std::function<TrainState&(const CheckpointManifest& manifest)>;
void load_checkpoint(MpiComm& comm, const std::string& path, const LoadDestinations& destinations,
                     const LoadOptions& options = {});

// Collective. Calls attempt(path) on every rank for each candidate of RunDir::resume_candidates (h5ddp/run_dir.hpp:
// ckpt-<step>.h5 from the highest step down) in turn until one returns; returns that path, std::nullopt when none
// did (rank 0 warns with what was wrong with each file skipped, and notes a resume from a file newer than the one
// `latest` names). An h5ddp::Error from attempt is damage and moves on to the next candidate: it must be raised
// on every rank together, as the checkpoint calls do. CheckpointMismatchError (another model) and
// DisagreementError (e.g. another optimizer) propagate: an older file of the run would not match either.
std::optional<std::string> resume_newest(Comm& comm, const std::string& run_dir,
                                         const std::function<void(const std::string& path)>& attempt);

// Collective. For a run that starts fresh in run_dir (--resume none): the ckpt-<step>.h5 files already there
// (the same list on every rank), which a later automatic resume would take while their step is higher than
// the new run's newest save. Rank 0 warns, naming them, when there are any.
std::vector<std::string> warn_of_checkpoints_in_fresh_run_dir(Comm& comm, const std::string& run_dir);

// Collective. Full verification of one file (structure + every checksum), datasets shared among ranks.
// Returns the problems found (empty = valid), the same list on every rank.
std::vector<std::string> verify_checkpoint_collective(MpiComm& comm, const std::string& path);

// Non-collective, single process (for h5ddp-ckpt verify): recompute every checksum, check structure against
// docs/FORMAT.md. Never throws for a bad file: every problem goes into the report.
struct VerifyReport {
  bool ok = false;
  std::vector<std::string> problems;  // each names the file and the dataset (and the rule of docs/FORMAT.md)
  // What a file of a newer format revision holds that this reader does not know (ignored, not problems).
  std::vector<std::string> notes;
};
VerifyReport verify_checkpoint_file(const std::string& path);

// Non-collective. Manifest of a file opened by this process alone (tools). Throws like read_manifest.
CheckpointManifest read_manifest_serial(const std::string& path);

// Non-collective: one checkpoint opened by this process alone (tools: info, diff, export). Opening throws
// CheckpointError for a missing, non-HDF5, non-h5ddp or unsupported-version file, like read_manifest.
class CheckpointFile {
 public:
  explicit CheckpointFile(const std::string& path);
  ~CheckpointFile();
  CheckpointFile(const CheckpointFile&) = delete;
  CheckpointFile& operator=(const CheckpointFile&) = delete;

  const CheckpointManifest& manifest() const;
  // Every numeric dataset (tensors, optimizer state, /train, /data, /rng), `name` = absolute HDF5 path.
  std::vector<TensorInfo> datasets() const;
  // Raw bytes (C order, little endian) of a numeric dataset; throws CheckpointError on a checksum mismatch.
  std::vector<uint8_t> read(const std::string& dataset_path) const;
  // Scheduler state and meta strings as stored.
  SchedulerState scheduler() const;
  std::map<std::string, std::string> meta() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace h5ddp

// Private pieces shared by the checkpoint sources: the write/read plan (pure: which dataset, which rows,
// which rank), hashing, errors for Comm::rethrow_first, fault injection.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "h5/h5.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/comm.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/train_state.hpp"

namespace h5ddp::ckpt {

// Rows [row_begin, row_end) of plan entry `index` handled by `rank`.
struct Segment {
  size_t index = 0;
  int rank = 0;
  uint64_t row_begin = 0, row_end = 0;
};

// One dataset of a checkpoint as the writer or reader sees it.
struct DatasetPlan {
  std::string path;  // absolute HDF5 path (built with format.hpp helpers)
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;  // empty = scalar
  size_t string_size = 0;      // > 0: fixed-length string dataset of `shape[0]` elements of this size
  const void* src = nullptr;   // save: this rank's full copy of the bytes (C order)
  void* dst = nullptr;         // load: where the bytes go
  uint64_t checksum = 0;
  bool tensor = false;       // save: src is a caller's tensor (hashed while writing, not in the plan)
  int owner = -1;            // >= 0: sharded, only rank `owner` holds the bytes (src is null elsewhere) and writes them
  std::vector<int> holders;  // sharded, whole: the ranks holding a copy (owner among them; the copies must agree)
  // Element-range sharding: the ranks' row pieces, which tile the dataset (index unused); each rank writes (or
  // reads) its own, and src (dst) holds only this rank's rows, from row src_row on. Empty: not split.
  std::vector<Segment> pieces;
  uint64_t src_row = 0;
  uint64_t src_row_end = 0;  // load: the end of this rank's rows (pieces only)

  size_t nbytes() const;
  size_t rows() const;       // shape[0], 1 for a scalar
  size_t row_bytes() const;  // nbytes() / rows(), 0 when empty
  h5::Handle file_type() const;
};

// Pure. Splits the concatenated bytes of `datasets` into `world` contiguous shares at row granularity; returns
// the non-empty segments in dataset order (and rank order within a dataset). Every row belongs to one segment.
// A dataset with an owner (sharded) is one segment of its owner and takes no part in the shares.
std::vector<Segment> compute_segments(const std::vector<DatasetPlan>& datasets, int world);
// Collective. The XXH3 of each dataset split in `pieces` (byte ranges of datasets, every rank's, the same list on
// every rank; `data` is this rank's bytes of its own pieces) as hash_bytes of the whole would give, computed
// without moving the bytes: each piece's owner continues the hash state (a few hundred bytes) the owner of the
// piece before it passes on, point to point. Ranks take their pieces in (dataset, offset) order, so every wait
// is for an earlier piece and the chain cannot deadlock. Returns (dataset, hash) for the datasets whose last
// piece this rank holds.
struct HashPiece {
  size_t dataset = 0;
  int rank = 0;
  uint64_t begin = 0, end = 0;  // bytes of the dataset
  const void* data = nullptr;   // this rank's bytes [begin, end) where rank is this rank
};
std::vector<std::pair<size_t, uint64_t>> chained_hashes(MpiComm& comm, std::vector<HashPiece> pieces);
// One sharded optimizer-state entry as the ranks list it: (rank, rows) per listing rank, all rows for a whole listing.
struct EntryListing {
  std::string name;
  int64_t rows = 0;
  bool any_piece = false;  // some rank lists rows of it only
  std::vector<Segment> listed;
};
// Pure. Where the listings break the rules of sharded state (save and load alike): the rows of an entry some rank
// holds in pieces must be held by exactly one rank each; a whole entry may be held by several ranks only where
// each of them holds rows of the same parameter (Adam's step of a split parameter). One line per problem, each
// "\n" + indent + text naming the entry, rows and ranks; "" when there is none.
std::string listing_problems(const std::vector<EntryListing>& entries, const std::string& indent);

// Pure. Assigns each whole dataset to one rank, greedily balancing bytes (used to share checksum work).
std::vector<int> assign_whole_datasets(const std::vector<DatasetPlan>& datasets, int world);

// The full save plan of one rank: datasets in a fixed order plus the storage of the small ones.
struct SavePlan {
  std::vector<DatasetPlan> datasets;
  std::list<std::vector<uint8_t>> storage;  // bytes of small datasets (counters, names, gathered rng rows)
  uint64_t structure_hash = 0;              // names, dtypes, shapes, attributes: must agree across ranks
  OptimizerState optimizer;                 // the optimizer state the file holds (merged when sharded)
};
// Where a sharded optimizer's state entry is: whole on rank `owner` (the lowest rank listing it: a whole entry
// several ranks list, such as Adam's step of a parameter split between them, holds one value), or split in the
// ranks' row pieces.
struct ShardPlacement {
  int owner = -1;
  std::vector<Segment> pieces;  // (rank, rows) each; empty: whole
  std::vector<int> holders;     // whole: every rank listing it (their copies must agree)
};
// Collective, for state.optimizer.sharded: every rank's share of the optimizer state merged into the full
// logical state (groups' parameter lists and state entries in the model's order, as a replicated optimizer
// lists them; an entry's TensorRef is this rank's listing of it, data null where it holds none);
// placement[i] says where entry i is. Row pieces that leave rows unowned or owned twice, entries listed with
// different shapes, different group counts: DisagreementError on every rank, naming the rows and ranks.
OptimizerState merge_optimizer_shards(Comm& comm, const TrainState& state, std::vector<ShardPlacement>& placement);
// Whether state.model holds tensors in row pieces (shard stage 3: refs with row_end >= 0, listed by every rank,
// with no rows where the rank holds none).
inline bool model_is_sharded(const TrainState& state) {
  for (const auto& t : state.model)
    if (t.row_end >= 0) return true;
  return false;
}
// Collective. state.model with its row pieces merged between the ranks as merge_optimizer_shards merges the
// optimizer's; placement[i] says where tensor i is (empty: replicated, every rank holds it). Pieces that leave
// rows unowned or owned twice: DisagreementError on every rank.
std::vector<TensorRef> merge_model_pieces(Comm& comm, const TrainState& state, std::vector<ShardPlacement>& placement);
// Collective (allgathers the rng rows). Builds the plan and computes the checksums of the small datasets;
// tensor datasets (`tensor` set) get theirs while they are written (see save_checkpoint).
SavePlan make_save_plan(Comm& comm, const TrainState& state);

// Verification reads each dataset through one reused buffer of this size per rank (whatever the checkpoint's
// size) and hashes each piece right after reading it, while it is still in the CPU cache (measurements:
// docs/DESIGN.md, "Verification is streamed").
constexpr size_t kVerifyBufferBytes = 4u << 20;
// Load reads a dataset it verifies straight into the destination in pieces of this size, each hashed right
// after its read (still in the last-level cache). Larger than kVerifyBufferBytes because the destination is not
// a reused buffer, and because on a disk-bound load fewer, larger reads keep more I/O in flight: 1 GiB at
// 1 rank read from disk, 4 MiB pieces 0.72x the raw MPI-IO read, 16 MiB 0.87x, 64 MiB 0.89x (medians of 15
// loads each, docs/DESIGN.md "Load verifies while the bytes are in cache").
constexpr size_t kLoadPieceBytes = 16u << 20;
// XXH3 (64 bits) of the bytes, with the fastest kernel this CPU runs (or the one H5DDP_HASH_KERNEL names).
uint64_t hash_bytes(const void* data, size_t n);
// The XXH3 kernels this CPU runs ("default": XXH3 as xxhash.h compiles for the target; "avx2" on x86-64 CPUs
// with AVX2), which one hash_bytes uses, and a named one: all give the same values, tests compare them.
std::vector<std::string> hash_kernels();
std::string hash_kernel();
uint64_t hash_bytes_with(const std::string& kernel, const void* data, size_t n);
// XXH3 of bytes fed in pieces: digest() equals hash_bytes() of their concatenation.
class StreamHash {
 public:
  StreamHash();
  explicit StreamHash(const std::string& kernel);
  ~StreamHash();
  StreamHash(const StreamHash&) = delete;
  StreamHash& operator=(const StreamHash&) = delete;
  void update(const void* data, size_t n);
  uint64_t digest() const;
  // The state as bytes, and back (chained_hashes passes it between ranks of one program).
  std::vector<uint8_t> state_bytes() const;
  void set_state_bytes(const std::vector<uint8_t>& bytes);

 private:
  explicit StreamHash(void (*update)(void* state, const void* data, size_t n));
  void* state_;  // XXH3_state_t (xxhash.h stays out of this header)
  void (*update_)(void* state, const void* data, size_t n);
};
// XXH3 of a sample of the bytes, seeded with n: all of them up to 64 KiB, else 16 blocks of 4 KiB spread
// evenly from the first byte to the last. The cheap replica check of save_checkpoint compares these.
uint64_t sample_hash(const void* data, size_t n);

// Hashes byte ranges (XXH3) on one background thread, so that checksums overlap the I/O: save_checkpoint
// hashes while it writes, load_checkpoint while it reads. The bytes must stay valid until finish() or the
// destructor, which both wait for every submitted range.
class BackgroundHasher {
 public:
  explicit BackgroundHasher(size_t slots);
  ~BackgroundHasher();
  BackgroundHasher(const BackgroundHasher&) = delete;
  BackgroundHasher& operator=(const BackgroundHasher&) = delete;
  void submit(size_t slot, const void* data, size_t n);
  // Stores a hash the caller computed itself (load hashes while it reads), so finish() returns all of them.
  void record(size_t slot, uint64_t hash);
  // Waits for everything submitted so far; result[slot] is the hash of the range submitted (or recorded) for
  // slot (0 if none).
  std::vector<uint64_t> finish();

 private:
  struct Job {
    size_t slot;
    const void* data;
    size_t n;
  };
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<uint64_t> results_;
  size_t pending_ = 0;
  bool closing_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

// "phase=seconds ..." of a save or load, for H5DDP_LOG_LEVEL=debug.
class PhaseTimer {
 public:
  PhaseTimer();
  void mark(const char* phase);  // time since the previous mark (or construction), under `phase`
  const std::string& timeline() const { return timeline_; }
  double total_seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_, last_;
  std::string timeline_;
};

// `message` without this process's leading "[host rank r/N] " tag (re-added once by whoever rethrows).
std::string strip_process_tag(const std::string& message);
// Runs f(), returning its exception message without the process tag ("" when it succeeded).
template <class F>
std::string capture_error(F&& f) {
  try {
    f();
    return {};
  } catch (const std::exception& e) {
    return strip_process_tag(e.what());
  }
}
// What this rank passes to Comm::rethrow_first, the one agreement helper ("agree, then throw"): null when
// `local_error` is empty, else a CheckpointError (CheckpointMismatchError with `mismatch`) carrying it, so that
// every rank raises the checkpoint layer's error type with the lowest failing rank's message. A message that
// starts with a process tag already (another rank's error, captured again) gets no second one.
std::exception_ptr checkpoint_error(const std::string& local_error, bool mismatch = false);
// Runs f(); its error (any exception) as checkpoint_error of its message, null when it succeeded:
// comm.rethrow_first(checkpoint_error_of([&] { ... })) so that no rank leaves a collective sequence alone.
template <class F>
std::exception_ptr checkpoint_error_of(F&& f) {
  return checkpoint_error(capture_error(std::forward<F>(f)));
}

// Test-only hook (issues 9, 23): H5DDP_FAULT_INJECT=<phase>:<rank|all>, armed by H5DDP_TEST_HOOKS=1, raises
// SIGKILL on the named rank(s) when the save reaches `phase`: before_data, mid_data, before_rename,
// before_latest; on rank 0 only: latest_written (latest.tmp written and fsynced, not renamed), latest_renamed
// (renamed, directory not fsynced), mid_retention (after each checkpoint retention removed).
void maybe_inject_fault(const char* phase, int rank);
// Whether H5DDP_FAULT_INJECT (armed as above) names `phase` and this rank. Besides the kills above:
// load_flip, one bit of the first tensor flipped in this rank's copy as a load reads (page cache) or
// receives (share + exchange) it, before it is verified: one node's copy gone wrong.
bool fault_armed(const char* phase, int rank);

// Opens a checkpoint for reading: collectively with MPI-IO over comm's communicator (comm != nullptr) or by this
// process alone. Throws CheckpointError for a missing, non-HDF5, non-h5ddp or unsupported-version file.
h5::Handle open_checkpoint(MpiComm* comm, const std::string& path, const MpiioHints& hints = {});
// Test-only: how many files open_checkpoint has opened (H5Fopen) in this process so far; a test asserts that a
// resume opens its checkpoint exactly once per rank.
int checkpoint_opens();
// The manifest of a file whose layout keeps docs/FORMAT.md's rules, from one walk of its metadata; throws
// CheckpointError listing every problem otherwise (damage: a loader refuses the file before it compares it with
// anything).
CheckpointManifest read_valid_manifest(hid_t file, const std::string& path);
// One message of several problems (each one line naming the file), or the one.
std::string joined_problems(const std::vector<std::string>& problems);
// Reads the manifest from an open file (collective when the file was opened collectively).
CheckpointManifest read_manifest_from(hid_t file, const std::string& path);
// The `n` elements of the open fixed-length strings dataset `ds` of file type `type`, each up to its first NUL.
std::vector<std::string> read_string_elements(hid_t ds, hid_t type, size_t n);
// Every dataset the manifest says the file holds (tensors, names, counters, rng), dst/src unset.
std::vector<DatasetPlan> manifest_datasets(hid_t file, const CheckpointManifest& m);

// Selects rows [begin, end) (dimension 0) of a dataspace of `shape`; all of a scalar; nothing when begin == end.
void select_rows(hid_t space, const std::vector<int64_t>& shape, uint64_t begin, uint64_t end);
// MPI-IO counts are int: one HDF5 transfer moves at most kMaxTransferBytes (more rows go in several calls).
// H5DDP_MAX_TRANSFER_BYTES (test-only) lowers it so that small tests exercise the multi-call paths.
inline constexpr uint64_t kMaxTransferBytes = 1ull << 30;
uint64_t max_transfer_bytes();
// Number of transfers needed for rows [begin, end) of `d`.
size_t transfer_count(const DatasetPlan& d, uint64_t begin, uint64_t end);
// Reads rows [row_begin, row_end) of `d` into `buf` (which receives row_begin first), with the given transfer
// list, in max(min_calls, transfer_count) calls (collective transfers: every rank must make the same number).
void read_rows(hid_t dset, const DatasetPlan& d, uint64_t row_begin, uint64_t row_end, void* buf, hid_t dxpl,
               size_t min_calls = 0);
// Verifies one dataset's checksum by streaming it through `buf` (grown as needed; the caller reuses it for
// every dataset of a file: a fresh buffer per dataset costs page faults and zeroing); returns "" or the problem.
std::string verify_dataset(hid_t file, const DatasetPlan& d, const std::string& file_path, std::vector<char>& buf);

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace h5ddp::ckpt

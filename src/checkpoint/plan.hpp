// The checkpoint plan (private to h5ddp_checkpoint): which datasets a TrainState becomes, which rows each rank
// handles, and where sharded state lives. The share computations are pure (tested without MPI).
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "h5/h5.hpp"
#include "h5ddp/comm.hpp"
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

// "[d0,d1,...]" ("[]" for a scalar), for messages.
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace h5ddp::ckpt

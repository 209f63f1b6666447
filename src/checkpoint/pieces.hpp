// Element-range sharding (private to h5ddp_checkpoint): the chained XXH3 of datasets whose rows several ranks hold,
// and the rules the ranks' row pieces must keep (docs/SHARDING.md).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/plan.hpp"

namespace h5ddp {
class MpiComm;  // h5ddp/mpi_comm.hpp
}

namespace h5ddp::ckpt {

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

}  // namespace h5ddp::ckpt

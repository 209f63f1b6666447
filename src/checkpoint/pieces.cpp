// Element-range sharding in the checkpoint layer: the chained XXH3 of datasets whose rows several ranks hold,
// and the check that ranks' row pieces tile a dataset (docs/SHARDING.md).
#include "checkpoint/pieces.hpp"

#include <mpi.h>

#include <algorithm>
#include <list>
#include <map>
#include <set>

#include "checkpoint/hash.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/mpi_comm.hpp"

namespace h5ddp::ckpt {

namespace {
constexpr int kChainTag = 0x4853;  // one tag: MPI keeps messages between two ranks in order, and both sides
                                   // send and receive in the same (dataset, offset) order
}

std::vector<std::pair<size_t, uint64_t>> chained_hashes(MpiComm& comm, std::vector<HashPiece> pieces) {
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const HashPiece& p) { return p.end <= p.begin; }),
               pieces.end());
  std::sort(pieces.begin(), pieces.end(), [](const HashPiece& a, const HashPiece& b) {
    return a.dataset != b.dataset ? a.dataset < b.dataset : a.begin < b.begin;
  });
  const int me = comm.rank();
  std::vector<std::pair<size_t, uint64_t>> out;
  std::list<std::vector<uint8_t>> sent;  // kept alive until the sends complete
  std::vector<MPI_Request> requests;
  StreamHash hash;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const HashPiece& p = pieces[k];
    if (p.rank != me) continue;
    const bool first = k == 0 || pieces[k - 1].dataset != p.dataset;
    const bool last = k + 1 == pieces.size() || pieces[k + 1].dataset != p.dataset;
    if (first) {
      StreamHash fresh;
      hash.set_state_bytes(fresh.state_bytes());
    } else if (pieces[k - 1].rank != me) {
      std::vector<uint8_t> state(hash.state_bytes().size());
      H5DDP_CHECK_MPI(MPI_Recv(state.data(), static_cast<int>(state.size()), MPI_BYTE, pieces[k - 1].rank, kChainTag,
                               comm.handle(), MPI_STATUS_IGNORE));
      hash.set_state_bytes(state);
    }  // else: this rank hashed the piece before, and `hash` continues it
    hash.update(p.data, p.end - p.begin);
    if (last) {
      out.emplace_back(p.dataset, hash.digest());
    } else if (pieces[k + 1].rank != me) {
      sent.push_back(hash.state_bytes());
      requests.emplace_back();
      H5DDP_CHECK_MPI(MPI_Isend(sent.back().data(), static_cast<int>(sent.back().size()), MPI_BYTE, pieces[k + 1].rank,
                                kChainTag, comm.handle(), &requests.back()));
    }
  }
  if (!requests.empty())
    H5DDP_CHECK_MPI(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  return out;
}

namespace {

// Where the row pieces of one entry leave rows unowned or owned twice.
std::string piece_coverage(const EntryListing& e, const std::string& indent) {
  std::vector<Segment> pieces = e.listed;
  std::sort(pieces.begin(), pieces.end(), [](const Segment& a, const Segment& b) {
    return a.row_begin != b.row_begin ? a.row_begin < b.row_begin : a.rank < b.rank;
  });
  std::string out;
  auto range = [](uint64_t b, uint64_t f) { return "rows [" + std::to_string(b) + ", " + std::to_string(f) + ")"; };
  uint64_t covered = 0;
  int last_rank = -1;
  for (const Segment& s : pieces) {
    if (s.row_end <= s.row_begin) continue;
    if (s.row_begin > covered)
      out += "\n" + indent + range(covered, s.row_begin) + " of " + e.name + " are held by no rank";
    else if (s.row_begin < covered)
      out += "\n" + indent + range(s.row_begin, std::min(covered, s.row_end)) + " of " + e.name +
             " are held by ranks " + std::to_string(last_rank) + " and " + std::to_string(s.rank);
    if (s.row_end > covered) covered = s.row_end, last_rank = s.rank;
  }
  if (covered < static_cast<uint64_t>(e.rows))
    out += "\n" + indent + range(covered, static_cast<uint64_t>(e.rows)) + " of " + e.name + " are held by no rank";
  return out;
}

std::string parameter_of(const std::string& entry) {
  return entry.substr(0, entry.rfind('/'));
}

}  // namespace

std::string listing_problems(const std::vector<EntryListing>& entries, const std::string& indent) {
  std::set<std::pair<std::string, int>> split;  // (parameter, rank) where the rank holds rows of its state
  for (const auto& e : entries)
    if (e.any_piece)
      for (const Segment& s : e.listed) split.emplace(parameter_of(e.name), s.rank);
  std::string out;
  for (const auto& e : entries) {
    if (e.any_piece) {
      out += piece_coverage(e, indent);
      continue;
    }
    int lowest = e.listed.empty() ? 0 : e.listed.front().rank;
    for (const Segment& s : e.listed) lowest = std::min(lowest, s.rank);
    for (const Segment& s : e.listed)
      if (s.rank != lowest &&
          !(split.count({parameter_of(e.name), s.rank}) && split.count({parameter_of(e.name), lowest})))
        out +=
            "\n" + indent + e.name + " is held by ranks " + std::to_string(lowest) + " and " + std::to_string(s.rank);
  }
  return out;
}

}  // namespace h5ddp::ckpt

// load_checkpoint: compare the file with the caller's refs, read (share + exchange, or every rank reads
// everything), verify checksums (every rank, of every byte it keeps), fill the TrainState.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "checkpoint/direct_read.hpp"
#include "checkpoint/errors.hpp"
#include "checkpoint/fault_inject.hpp"
#include "checkpoint/hash.hpp"
#include "checkpoint/load_source.hpp"
#include "checkpoint/phase_timer.hpp"
#include "checkpoint/pieces.hpp"
#include "checkpoint/plan.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/rows.hpp"
#include "checkpoint/rules.hpp"
#include "h5ddp/clock.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/mpi_comm.hpp"

namespace h5ddp {
namespace {

// Load reads a dataset it verifies straight into the destination in pieces of this size, each hashed right
// after its read (still in the last-level cache). Larger than verification's buffer (kVerifyBufferBytes,
// verify.cpp) because the destination is not a reused buffer, and because on a disk-bound load fewer, larger
// reads keep more I/O in flight: 1 GiB at 1 rank read from disk, 4 MiB pieces 0.72x the raw MPI-IO read, 16 MiB
// 0.87x, 64 MiB 0.89x (medians of 15 loads each, docs/DESIGN.md "Load verifies while the bytes are in cache").
constexpr size_t kLoadPieceBytes = 16u << 20;

using ckpt::DatasetPlan;

std::string describe(DType dtype, const std::vector<int64_t>& shape) {
  return std::string(dtype_name(dtype)) + " " + ckpt::shape_string(shape);
}

// Every difference between the refs and the file, one line each ("" when they match exactly).
// `partial`: the refs are this rank's share of the group (sharded optimizer state): entries of the file they
// do not name belong to other ranks and are not differences here.
std::string compare_refs(const std::string& what, const std::string& group, const std::vector<TensorRef>& refs,
                         const std::vector<TensorInfo>& found, bool partial = false) {
  std::map<std::string, const TensorInfo*> in_file;
  for (const auto& t : found) in_file[t.name] = &t;
  std::string out;
  for (const auto& r : refs) {
    const std::string path = group + "/" + r.name;
    auto it = in_file.find(r.name);
    if (it == in_file.end()) {
      out += "\n  missing in file: " + path + " (expected " + describe(r.dtype, r.shape) + ")";
      continue;
    }
    const TensorInfo& t = *it->second;
    if (t.dtype != r.dtype || t.shape != r.shape)
      out += "\n  " + path + ": expected " + describe(r.dtype, r.shape) + ", found " + describe(t.dtype, t.shape);
    else if (r.held_nbytes() > 0 && r.data == nullptr)
      out += "\n  " + path + ": the destination has no memory";
    in_file.erase(it);
  }
  if (partial) return out;
  for (const auto& [name, t] : in_file)
    out += "\n  not in the " + what + ": " + group + "/" + name + " (" + describe(t->dtype, t->shape) + ")";
  return out;
}

// Collective, sharded loads. Which rows of each optimizer-state entry of the file each rank loads: every entry
// by at least one rank, and an entry some rank loads in row pieces by exactly one rank per row (whole entries
// several ranks load, such as Adam's step of a split parameter, are fine). Returns the problems (one line
// each); `pieces[i]` gets entry i's row pieces, the same on every rank (empty: loaded whole).
// Sharded entries of the file (stage 3's model tensors, then a sharded optimizer's state), with the refs that
// load them, both by dataset path.
struct ShardedEntries {
  std::vector<TensorInfo> found;
  std::vector<std::string> paths;
  std::vector<std::pair<std::string, const TensorRef*>> refs;
  size_t model_entries = 0;  // found[0, model_entries) are model tensors
};

std::string shard_coverage(Comm& comm, const ShardedEntries& sharded, std::vector<std::vector<ckpt::Segment>>& pieces) {
  const std::vector<TensorInfo>& found = sharded.found;
  const size_t n_model = sharded.model_entries;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < found.size(); ++i) index.emplace(sharded.paths[i], i);
  // Per entry: kind (0 not loaded here, 1 whole, 2 rows), row_begin, row_end.
  std::vector<int64_t> mine(3 * found.size(), 0);
  for (const auto& [path, ref] : sharded.refs)
    if (auto it = index.find(path); it != index.end()) {
      const TensorRef& r = *ref;
      mine[3 * it->second] = r.piece() ? 2 : 1;
      mine[3 * it->second + 1] = r.piece() ? r.row_begin : 0;
      mine[3 * it->second + 2] = r.piece() ? r.row_end : r.rows();
    }
  std::vector<int64_t> all(mine.size() * comm.size());
  if (!mine.empty()) comm.allgather(mine.data(), all.data(), mine.size(), DType::kI64);
  std::string out;
  pieces.assign(found.size(), {});
  std::vector<ckpt::EntryListing> listings;  // entries some rank loads, named by their dataset paths
  for (size_t i = 0; i < found.size(); ++i) {
    const std::string& path = sharded.paths[i];
    ckpt::EntryListing e{path, found[i].shape.empty() ? 1 : found[i].shape[0], false, {}};
    bool listed = false;
    for (int r = 0; r < comm.size(); ++r) {
      const int64_t* c = &all[(static_cast<size_t>(r) * found.size() + i) * 3];
      if (c[0] == 0) continue;
      listed = true;
      e.any_piece = e.any_piece || c[0] == 2;
      if (c[0] == 2 && c[1] == c[2]) continue;  // a rank holding none of a stage-3 model tensor's rows
      e.listed.push_back(ckpt::Segment{i, r, static_cast<uint64_t>(c[1]), static_cast<uint64_t>(c[2])});
    }
    if (!listed)
      out += "\n  not in the " + std::string(i < n_model ? "model" : "optimizer state") + " of any rank: " + path +
             " (" + describe(found[i].dtype, found[i].shape) + ")";
    if (e.any_piece) {
      pieces[i] = e.listed;
      std::sort(pieces[i].begin(), pieces[i].end(),
                [](const ckpt::Segment& a, const ckpt::Segment& b) { return a.row_begin < b.row_begin; });
    }
    listings.push_back(std::move(e));
  }
  out += ckpt::listing_problems(listings, "  ");
  return out;
}

DatasetPlan load_one(const TensorRef& r, std::string path, uint64_t checksum) {
  DatasetPlan d;
  d.path = std::move(path);
  d.dtype = r.dtype;
  d.shape = r.shape;
  d.dst = r.data;
  d.checksum = checksum;
  return d;
}

std::vector<DatasetPlan> load_plan(const std::vector<TensorRef>& refs, const std::vector<TensorInfo>& found,
                                   std::string (*dataset_path)(const std::string&)) {
  std::map<std::string, uint64_t> sums;
  for (const auto& t : found) sums[t.name] = t.checksum;
  std::vector<DatasetPlan> out;
  for (const auto& r : refs) out.push_back(load_one(r, dataset_path(r.name), sums.at(r.name)));
  return out;
}

h5::Handle open_dataset(hid_t f, const std::string& path) {
  return h5::dataset(H5Dopen2(f, path.c_str(), H5P_DEFAULT));
}

// Broadcasts every rank's share to all ranks. A share is scattered over many tensors; one broadcast per
// tensor piece measured several times slower than the bytes warrant (each collective pays a latency, large
// when ranks are oversubscribed), so each owner sends its whole share in one MPI_Bcast of an hindexed
// datatype over the destination addresses (zero-copy; groups of <= 1 GiB keep MPI's int sizes safe).
void exchange_shares(MpiComm& comm, const std::vector<DatasetPlan>& plan, const std::vector<ckpt::Segment>& segments) {
  constexpr size_t kGroupBytes = 1u << 30;
  MPI_Comm mc = comm.handle();
  for (int owner = 0; owner < comm.size(); ++owner) {
    std::vector<MPI_Aint> displs;
    std::vector<int> lens;
    size_t group = 0;
    auto flush = [&] {
      if (lens.empty()) return;
      MPI_Datatype t;
      H5DDP_CHECK_MPI(
          MPI_Type_create_hindexed(static_cast<int>(lens.size()), lens.data(), displs.data(), MPI_BYTE, &t));
      H5DDP_CHECK_MPI(MPI_Type_commit(&t));
      const int rc = MPI_Bcast(MPI_BOTTOM, 1, t, owner, mc);
      MPI_Type_free(&t);
      H5DDP_CHECK_MPI(rc);
      displs.clear(), lens.clear(), group = 0;
    };
    for (const auto& s : segments) {
      if (s.rank != owner) continue;
      const auto& d = plan[s.index];
      char* p = static_cast<char*>(d.dst) + s.row_begin * d.row_bytes();
      size_t left = (s.row_end - s.row_begin) * d.row_bytes();
      while (left > 0) {
        const size_t n = std::min(left, kGroupBytes - group);
        MPI_Aint addr;
        H5DDP_CHECK_MPI(MPI_Get_address(p, &addr));
        displs.push_back(addr);
        lens.push_back(static_cast<int>(n));
        group += n, p += n, left -= n;
        if (group == kGroupBytes) flush();
      }
    }
    flush();
  }
}

// Whether page-cache reads go through a reused bounce buffer (H5DDP_LOAD_BOUNCE=0 turns it off; read once).
// On VMs with a paravirtualised MMU the kernel's first write into a process's pages costs about 1.4 s per GiB,
// even into pages the process has already touched, while a copy in user space costs about 0.2 s: reading each
// piece into one reused buffer and copying it out was 3-7x faster for a first load there. On other hosts the
// copy costs one memcpy of the bytes (docs/BENCHMARKS.md, "Load through the bounce buffer"; docs/DEFAULTS.md).
bool bounce_reads() {
  static const bool on = [] {
    const char* e = std::getenv("H5DDP_LOAD_BOUNCE");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

// Reads all of `d` into d.dst in pieces of about kLoadPieceBytes (fewer with H5DDP_MAX_TRANSFER_BYTES, which
// tests lower); with `hash`, each piece is hashed right after it is read, while it is still in the CPU cache (one
// pass over memory instead of two). With a `bounce` buffer (bounce_reads()) each piece lands there first and is
// copied to d.dst; a row larger than a piece goes straight to d.dst.
void read_pieces(hid_t ds, const DatasetPlan& d, hid_t dxpl, ckpt::StreamHash* hash, std::vector<char>* bounce,
                 bool flip_test_hook) {
  const size_t rb = d.row_bytes(), first = d.pieces.empty() ? 0 : d.src_row;
  const size_t rows = d.pieces.empty() ? d.rows() : d.src_row_end;
  const size_t piece = std::min<uint64_t>(kLoadPieceBytes, ckpt::max_transfer_bytes());
  const size_t per = std::max<size_t>(1, rb ? piece / rb : 1);
  const bool via_bounce = bounce != nullptr && rb > 0 && rb <= piece;
  if (via_bounce && bounce->size() < per * rb) bounce->resize(per * rb);
  for (size_t r = first; r < rows; r += per) {
    const size_t end = std::min(rows, r + per), n = (end - r) * rb;
    char* p = static_cast<char*>(d.dst) + (r - first) * rb;
    char* into = via_bounce ? bounce->data() : p;
    ckpt::read_rows(ds, d, r, end, into, dxpl);
    if (flip_test_hook && r == first && n > 0) into[0] ^= 1;
    if (hash) hash->update(into, n);
    if (via_bounce) std::memcpy(p, into, n);
  }
}

// Datasets smaller than this go through H5Dread even with direct reads: they are a small part of the bytes,
// and one O_DIRECT request per small dataset would wait on the device each time.
constexpr size_t kDirectMinBytes = 1u << 20;

// Where d's bytes lie in the file when a plain read of them gives exactly what H5Dread would: contiguous
// layout (no chunks, filters or external files), all of it allocated, and the file's type the one it is read
// as (no conversion). std::nullopt otherwise.
std::optional<uint64_t> raw_offset(hid_t ds, const DatasetPlan& d) {
  const haddr_t offset = H5Dget_offset(ds);
  if (offset == HADDR_UNDEF || H5Dget_storage_size(ds) != d.nbytes()) return std::nullopt;
  h5::Handle stored = h5::datatype(H5Dget_type(ds));
  h5::Handle wanted = d.file_type();
  if (H5Tequal(stored, wanted) <= 0) return std::nullopt;
  return static_cast<uint64_t>(offset);
}

// Whether this rank reads around the page cache (LoadOptions::direct_io). Collective when `mode` is kAuto:
// the ranks of `comm` that share this host are found as MpiEnv finds a node's ranks (MPI_COMM_TYPE_SHARED).
bool use_direct_io(MpiComm& comm, LoadOptions::DirectIo mode) {
  if (mode != LoadOptions::DirectIo::kAuto) return mode == LoadOptions::DirectIo::kOn;
  int on_host = 1;
  if (comm.size() > 1) {
    MPI_Comm host;
    H5DDP_CHECK_MPI(MPI_Comm_split_type(comm.handle(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &host));
    MPI_Comm_size(host, &on_host);
    MPI_Comm_free(&host);
  }
  const char* e = std::getenv("H5DDP_DIRECT_IO");
  const bool on = e ? std::string(e) != "0" : on_host == 1;
  log::debug(std::string("load: O_DIRECT ") + (on ? "on" : "off") + " (" + std::to_string(on_host) +
             " rank(s) on this host" + (e ? ", H5DDP_DIRECT_IO set" : "") + ")");
  return on;
}

// Reads one dataset with H5Dread (every-rank-reads), hashing it as it reads when verify_here; or, when `direct`
// and the dataset is large and raw, only lists it in `extents` for read_extents_direct.
void read_dataset_whole(hid_t f, const DatasetPlan& d, size_t i, hid_t dxpl, bool direct, bool verify_here,
                        std::vector<ckpt::FileExtent>& extents, std::vector<size_t>& extent_slot,
                        std::vector<char>& bounce, bool& flip, ckpt::BackgroundHasher& hasher) {
  h5::SilenceErrors quiet;
  h5::Handle ds = open_dataset(f, d.path);
  const uint64_t first = d.pieces.empty() ? 0 : d.src_row;
  const uint64_t n = d.pieces.empty() ? d.nbytes() : (d.src_row_end - d.src_row) * d.row_bytes();
  if (direct && n >= kDirectMinBytes) {
    if (const auto offset = raw_offset(ds, d)) {
      extents.push_back(ckpt::FileExtent{*offset + first * d.row_bytes(), n, static_cast<char*>(d.dst), d.path});
      extent_slot.push_back(i);
      return;
    }
  }
  std::optional<ckpt::StreamHash> hash;
  if (verify_here) hash.emplace();
  read_pieces(ds, d, dxpl, hash ? &*hash : nullptr, bounce_reads() ? &bounce : nullptr, flip);
  flip = false;
  if (hash) hasher.record(i, hash->digest());
}

// Every rank reads every byte: contiguous datasets of a directly readable type go to read_extents_direct (when
// `direct`), the rest through H5Dread; each dataset with verify_here[i] is hashed as it arrives (recorded).
void read_every_rank(MpiComm& comm, hid_t f, const std::vector<DatasetPlan>& plan, bool direct, const std::string& path,
                     const std::vector<char>& verify_here, ckpt::BackgroundHasher& hasher) {
  std::string error;
  std::vector<ckpt::FileExtent> extents;
  std::vector<size_t> extent_slot;
  std::vector<char> bounce;  // reused for every dataset of this load
  h5::Handle indep = h5::transfer(false);
  bool flip = ckpt::fault_armed("load_flip", comm.rank());  // test hook: this rank's copy of one tensor goes wrong
  for (size_t i = 0; i < plan.size() && error.empty(); ++i) {
    const auto& d = plan[i];
    if (d.nbytes() > 0)
      error = ckpt::capture_error([&] {
        with_context("reading " + d.path + " from " + path, [&] {
          read_dataset_whole(f, d, i, indep, direct, verify_here[i], extents, extent_slot, bounce, flip, hasher);
        });
      });
    else if (verify_here[i])
      hasher.record(i, ckpt::hash_bytes(nullptr, 0));
  }
  if (error.empty() && !extents.empty())
    error = ckpt::capture_error([&] {
      // The pieces arrive in order, one extent after the other: one streaming hash at a time, recorded when
      // its extent's last byte is in.
      std::optional<ckpt::StreamHash> hash;
      uint64_t hashed = 0;
      ckpt::read_extents_direct(path, extents, [&](size_t e, const char* data, size_t n) {
        if (!verify_here[extent_slot[e]]) return;
        if (!hash) hash.emplace(), hashed = 0;
        hash->update(data, n);
        if ((hashed += n) == extents[e].n) hasher.record(extent_slot[e], hash->digest()), hash.reset();
      });
    });
  comm.rethrow_first(ckpt::checkpoint_error(error));
}

// Share + exchange, reading: the datasets split between ranks collectively (all ranks in plan order, calling on
// after an error), then this rank's whole datasets independently. Returns this rank's first error.
std::string read_own_share(hid_t f, const std::vector<DatasetPlan>& plan, const std::vector<ckpt::Segment>& segments,
                           const std::vector<int>& pieces, int rank, const std::string& path, Clock::time_point t0) {
  std::string error;
  h5::Handle coll = h5::transfer(true), indep = h5::transfer(false);
  auto at_row = [&](const DatasetPlan& d, uint64_t row) { return static_cast<char*>(d.dst) + row * d.row_bytes(); };
  auto read = [&](const DatasetPlan& d, uint64_t begin, uint64_t end, hid_t dxpl, size_t calls) {
    return ckpt::capture_error([&] {
      with_context("reading " + d.path + " from " + path, [&] {
        h5::SilenceErrors quiet;
        h5::Handle ds = open_dataset(f, d.path);
        ckpt::read_rows(ds, d, begin, end, at_row(d, begin), dxpl, calls);
      });
    });
  };
  for (size_t i = 0; i < plan.size(); ++i) {
    if (pieces[i] < 2) continue;
    uint64_t begin = 0, end = 0;
    size_t calls = 0;  // the most any rank needs: collective calls must match
    for (const auto& s : segments) {
      if (s.index != i) continue;
      calls = std::max(calls, ckpt::transfer_count(plan[i], s.row_begin, s.row_end));
      if (s.rank == rank) begin = s.row_begin, end = s.row_end;
    }
    std::string e = read(plan[i], begin, end, coll, calls);
    if (error.empty()) error = e;
  }
  log::debug("load: collective reads done at " + std::to_string(seconds_since(t0)));
  for (const auto& s : segments)
    if (s.rank == rank && pieces[s.index] < 2 && error.empty())
      error = read(plan[s.index], s.row_begin, s.row_end, indep, 0);
  return error;
}

// Share + exchange, once every byte is in: the datasets with verify_here[i] go to the background hasher (the test
// hook load_flip first damages this rank's copy of the first non-empty one).
void submit_exchanged(MpiComm& comm, const std::vector<DatasetPlan>& plan, const std::vector<char>& verify_here,
                      ckpt::BackgroundHasher& hasher) {
  if (ckpt::fault_armed("load_flip", comm.rank()))
    for (auto& d : plan)
      if (d.nbytes() > 0) {
        static_cast<char*>(d.dst)[0] ^= 1;
        break;
      }
  for (size_t i = 0; i < plan.size(); ++i)
    if (verify_here[i]) hasher.submit(i, plan[i].dst, plan[i].nbytes());
}

// Share + exchange: each rank reads its share, the ranks exchange them, then the datasets with verify_here[i]
// go to the background hasher (their bytes are all in).
void read_share_exchange(MpiComm& comm, hid_t f, const std::vector<DatasetPlan>& plan, const std::string& path,
                         const std::vector<char>& verify_here, ckpt::BackgroundHasher& hasher) {
  const auto t0 = Clock::now();
  const auto segments = ckpt::compute_segments(plan, comm.size());
  std::vector<int> pieces(plan.size(), 0);
  for (const auto& s : segments) ++pieces[s.index];
  comm.rethrow_first(ckpt::checkpoint_error(read_own_share(f, plan, segments, pieces, comm.rank(), path, t0)));
  log::debug("load: own share read at " + std::to_string(seconds_since(t0)));
  if (comm.size() > 1) {
    exchange_shares(comm, plan, segments);
    log::debug("load: exchange done at " + std::to_string(seconds_since(t0)));
  }
  submit_exchanged(comm, plan, verify_here, hasher);
}

// File offsets of the tensor datasets, from rank 0's read of the metadata (ckpt::LoadSource::offsets).
using Offsets = std::map<std::string, uint64_t>;

// Bytes per read of a raw load: kLoadPieceBytes, or less with H5DDP_MAX_TRANSFER_BYTES (tests).
size_t raw_piece_bytes() {
  return static_cast<size_t>(std::min<uint64_t>(kLoadPieceBytes, ckpt::max_transfer_bytes()));
}

// Where this rank's bytes of d (all of it, or its rows of a split dataset) lie in the file, and where they go.
ckpt::FileExtent extent_of(const DatasetPlan& d, const Offsets& offsets) {
  const uint64_t first = d.pieces.empty() ? 0 : d.src_row;
  const uint64_t n = d.pieces.empty() ? d.nbytes() : (d.src_row_end - d.src_row) * d.row_bytes();
  if (n == 0) return ckpt::FileExtent{0, 0, static_cast<char*>(d.dst), d.path};  // no offset: nothing stored
  return ckpt::FileExtent{offsets.at(d.path) + first * d.row_bytes(), n, static_cast<char*>(d.dst), d.path};
}

// A consumer for the raw readers: each extent's pieces arrive in order, one extent after the other; extent e is
// plan entry slot[e], hashed when verify_here says so and recorded once its last byte is in. flip_slot (test
// hook load_flip): that entry's first byte is flipped in this rank's copy before it is hashed.
std::function<void(size_t, const char*, size_t)> streaming_hasher(const std::vector<ckpt::FileExtent>& x,
                                                                  const std::vector<size_t>& slot,
                                                                  const std::vector<char>& verify_here,
                                                                  ckpt::BackgroundHasher& hasher, size_t flip_slot) {
  auto hash = std::make_shared<std::optional<ckpt::StreamHash>>();
  auto hashed = std::make_shared<uint64_t>(0);
  return [&x, &slot, &verify_here, &hasher, flip_slot, hash, hashed](size_t e, const char* data, size_t n) {
    if (slot[e] == flip_slot && data == x[e].dst) x[e].dst[0] ^= 1;
    if (!verify_here[slot[e]]) return;
    if (!*hash) hash->emplace(), *hashed = 0;
    (*hash)->update(data, n);
    if ((*hashed += n) == x[e].n) hasher.record(slot[e], (*hash)->digest()), hash->reset();
  };
}

// Every rank reads every byte at the offsets rank 0 shared: with `direct`, datasets of kDirectMinBytes or more
// around the page cache (read_extents_direct), the rest in coalesced reads through it (read_extents_coalesced);
// each dataset with verify_here[i] hashed as its bytes arrive.
void read_every_rank_raw(MpiComm& comm, const Offsets& offsets, const std::vector<DatasetPlan>& plan, bool direct,
                         const std::string& path, const std::vector<char>& verify_here,
                         ckpt::BackgroundHasher& hasher) {
  std::vector<ckpt::FileExtent> small, large;
  std::vector<size_t> small_slot, large_slot;
  size_t flip_slot = ckpt::fault_armed("load_flip", comm.rank()) ? plan.size() : SIZE_MAX;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ckpt::FileExtent e = extent_of(plan[i], offsets);
    if (e.n == 0) {
      if (verify_here[i]) hasher.record(i, ckpt::hash_bytes(nullptr, 0));
      continue;
    }
    const bool big = direct && e.n >= kDirectMinBytes;
    if (flip_slot == plan.size() && !big) flip_slot = i;  // the first dataset read through the page cache
    (big ? large : small).push_back(e);
    (big ? large_slot : small_slot).push_back(i);
  }
  const std::string error = ckpt::capture_error([&] {
    ckpt::read_extents_coalesced(path, small, raw_piece_bytes(), bounce_reads(),
                                 streaming_hasher(small, small_slot, verify_here, hasher, flip_slot));
    ckpt::maybe_inject_fault("load_mid_data", comm.rank());  // test hook: a rank dies between its reads
    if (!large.empty())
      ckpt::read_extents_direct(path, large, streaming_hasher(large, large_slot, verify_here, hasher, SIZE_MAX));
  });
  comm.rethrow_first(ckpt::checkpoint_error(error));
}

// Share + exchange at the offsets rank 0 shared: each rank reads its share (compute_segments) in coalesced reads,
// the ranks exchange the shares, then the datasets with verify_here[i] go to the background hasher.
void read_share_exchange_raw(MpiComm& comm, const Offsets& offsets, const std::vector<DatasetPlan>& plan,
                             const std::string& path, const std::vector<char>& verify_here,
                             ckpt::BackgroundHasher& hasher) {
  const auto segments = ckpt::compute_segments(plan, comm.size());
  std::vector<ckpt::FileExtent> mine;
  for (const auto& s : segments) {
    if (s.rank != comm.rank()) continue;
    const DatasetPlan& d = plan[s.index];
    const uint64_t rb = d.row_bytes();
    if (s.row_end == s.row_begin) continue;
    mine.push_back(ckpt::FileExtent{offsets.at(d.path) + s.row_begin * rb, (s.row_end - s.row_begin) * rb,
                                    static_cast<char*>(d.dst) + s.row_begin * rb, d.path});
  }
  const std::string error = ckpt::capture_error([&] {
    ckpt::read_extents_coalesced(path, mine, raw_piece_bytes(), bounce_reads(), [](size_t, const char*, size_t) {});
    ckpt::maybe_inject_fault("load_mid_data", comm.rank());  // test hook: a rank dies before the exchange
  });
  comm.rethrow_first(ckpt::checkpoint_error(error));
  if (comm.size() > 1) exchange_shares(comm, plan, segments);
  submit_exchanged(comm, plan, verify_here, hasher);
}

// Reads the tensors with the chosen strategy: at the file offsets rank 0 shared (`offsets`, when every tensor
// dataset has one), else through HDF5 (`f`). On return (without exception) every rank holds every byte, and
// `hasher` holds the hash of every dataset with verify_here[i]: every-rank-reads hashes them while reading them,
// share + exchange submits each to the background thread once its bytes are in.
void read_tensors(MpiComm& comm, hid_t f, const Offsets* offsets, const std::vector<DatasetPlan>& plan,
                  LoadStrategy strategy, bool direct, const std::string& path, const std::vector<char>& verify_here,
                  ckpt::BackgroundHasher& hasher) {
  if (offsets && strategy == LoadStrategy::kEveryRankReads)
    read_every_rank_raw(comm, *offsets, plan, direct, path, verify_here, hasher);
  else if (offsets)
    read_share_exchange_raw(comm, *offsets, plan, path, verify_here, hasher);
  else if (strategy == LoadStrategy::kEveryRankReads)
    read_every_rank(comm, f, plan, direct, path, verify_here, hasher);
  else
    read_share_exchange(comm, f, plan, path, verify_here, hasher);
}

// The file's entries loaded in shares: the model tensors the refs hold in row pieces (every rank lists each such
// tensor, with no rows where it holds none), then, when sharded, all of the optimizer state.
ShardedEntries sharded_entries(const TrainState& state, const CheckpointManifest& m) {
  ShardedEntries out;
  std::set<std::string> piece_names;
  for (const auto& r : state.model)
    if (r.row_end >= 0) {
      piece_names.insert(r.name);
      out.refs.emplace_back(format::model_dataset(r.name), &r);
    }
  for (const auto& t : m.model)
    if (piece_names.count(t.name)) out.found.push_back(t), out.paths.push_back(format::model_dataset(t.name));
  out.model_entries = out.found.size();
  if (!state.optimizer.sharded) return out;
  for (const auto& r : state.optimizer.state) out.refs.emplace_back(format::optimizer_state_dataset(r.name), &r);
  for (const auto& t : m.optimizer_state)
    out.found.push_back(t), out.paths.push_back(format::optimizer_state_dataset(t.name));
  return out;
}

// Collective. The destinations must match the file exactly: ONE CheckpointMismatchError on every rank listing
// every difference of the refs (the lowest failing rank's list).
void check_destinations(MpiComm& comm, const std::string& path, const CheckpointManifest& m, const TrainState& state,
                        std::vector<std::vector<ckpt::Segment>>& pieces) {
  comm.require_same(state.optimizer.sharded ? 1 : 0, "whether the optimizer state is sharded");
  comm.require_same(ckpt::model_is_sharded(state) ? 1 : 0, "whether the model is held in row pieces");
  const bool sharded = state.optimizer.sharded;
  std::string diff =
      compare_refs("model", format::kModelGroup, state.model, m.model) +
      compare_refs("optimizer state", format::kOptimizerStateGroup, state.optimizer.state, m.optimizer_state, sharded) +
      compare_refs("user state", format::kUserGroup, state.user, m.user);
  const ShardedEntries entries = sharded_entries(state, m);
  if (!entries.found.empty()) diff += shard_coverage(comm, entries, pieces);
  if (!diff.empty()) {
    size_t n = 0;
    for (char c : diff) n += c == '\n';
    diff = path + " does not match the state to load into on rank " + std::to_string(comm.rank()) + " (" +
           std::to_string(n) + " difference" + (n == 1 ? "" : "s") + "):" + diff;
  }
  comm.rethrow_first(ckpt::checkpoint_error(diff, /*mismatch=*/true));
}

// The tensors to read: `shared` every rank reads (or receives) whole; `own` the sharded entries (sharded_entries)
// this rank holds, which it alone reads: a sharded optimizer's entries, and stage 3's model rows.
// Entries split in row pieces (element-range sharding) are read by rows: each rank reads its rows, and the ranks
// verify each such dataset together (ckpt::chained_hashes over `pieces`, by sharded entry).
struct TensorPlan {
  std::vector<DatasetPlan> shared, own;
  bool sharded = false;                            // some entries are read in shares (agreed: check_destinations)
  std::vector<std::vector<ckpt::Segment>> pieces;  // per sharded entry; empty: whole
  std::vector<size_t> own_entry;                   // own[i] is sharded entry own_entry[i]
  std::vector<uint64_t> row_bytes;                 // per sharded entry
};
TensorPlan plan_tensors(const TrainState& state, const CheckpointManifest& m,
                        std::vector<std::vector<ckpt::Segment>> pieces) {
  TensorPlan p;
  const ShardedEntries entries = sharded_entries(state, m);
  p.sharded = !entries.found.empty();
  p.pieces = std::move(pieces);
  std::map<std::string, size_t> entry;
  for (size_t i = 0; i < entries.found.size(); ++i) {
    const TensorInfo& t = entries.found[i];
    const uint64_t rows = t.shape.empty() ? 1 : static_cast<uint64_t>(t.shape[0]);
    p.row_bytes.push_back(rows ? t.nbytes() / rows : 0);
    entry.emplace(entries.paths[i], i);
  }
  for (const auto& [path, ref] : entries.refs) {
    const TensorRef& r = *ref;
    const size_t e = entry.at(path);
    if (r.piece() && r.row_begin == r.row_end) continue;  // none of its rows here
    p.own.push_back(load_one(r, path, entries.found[e].checksum));
    p.own_entry.push_back(e);
    if (p.pieces[e].empty()) continue;
    p.own.back().pieces = p.pieces[e];
    p.own.back().src_row = static_cast<uint64_t>(r.piece() ? r.row_begin : 0);
    p.own.back().src_row_end = static_cast<uint64_t>(r.piece() ? r.row_end : r.rows());
  }
  std::vector<TensorRef> whole_model;
  for (const auto& r : state.model)
    if (r.row_end < 0) whole_model.push_back(r);
  p.shared = load_plan(whole_model, m.model, format::model_dataset);
  if (!state.optimizer.sharded)
    for (auto& d : load_plan(state.optimizer.state, m.optimizer_state, format::optimizer_state_dataset))
      p.shared.push_back(std::move(d));
  for (auto& d : load_plan(state.user, m.user, format::user_dataset)) p.shared.push_back(std::move(d));
  return p;
}

// Collective. The checksums of the optimizer-state datasets loaded in row pieces, each computed by the ranks
// holding its pieces together (ckpt::chained_hashes) and compared by the rank holding the last piece. Returns
// this rank's problems (one line each).
std::string verify_pieces(MpiComm& comm, const TensorPlan& p, const std::string& path) {
  std::vector<ckpt::HashPiece> chain;
  std::map<size_t, const DatasetPlan*> mine;  // manifest entry -> this rank's plan of it
  for (size_t k = 0; k < p.own.size(); ++k)
    if (!p.own[k].pieces.empty()) mine[p.own_entry[k]] = &p.own[k];
  for (size_t e = 0; e < p.pieces.size(); ++e)
    for (const ckpt::Segment& s : p.pieces[e]) {
      const uint64_t rb = p.row_bytes[e];
      chain.push_back({e, s.rank, s.row_begin * rb, s.row_end * rb, s.rank == comm.rank() ? mine.at(e)->dst : nullptr});
    }
  std::string problems;
  for (const auto& [e, hash] : ckpt::chained_hashes(comm, std::move(chain)))
    if (hash != mine.at(e)->checksum)
      problems += "\n  R13: checksum mismatch in dataset " + mine.at(e)->path +
                  " (its pieces, hashed by the ranks "
                  "holding them, do not give the checksum of " +
                  path + ")";
  return problems;
}

// R22 over the bool tensors' bytes this rank holds (whole datasets, or its rows of a split one).
std::string bool_problems(const TensorPlan& p) {
  std::string out;
  for (const auto* list : {&p.shared, &p.own})
    for (const auto& d : *list) {
      if (d.dtype != DType::kBool || !d.dst) continue;
      const size_t n = d.pieces.empty() ? d.nbytes() : (d.src_row_end - d.src_row) * d.row_bytes();
      if (!ckpt::bool_bytes_ok(d.dst, n))
        out += "\n  R22: bool dataset " + d.path + " holds a value other than 0 and 1";
    }
  return out;
}

// Collective. Reads every tensor into its destination and verifies its checksum. Every rank verifies the checksum
// of every dataset it keeps, over the bytes in its own memory: a copy that went wrong on one node (its reads, its
// page cache, the exchange) cannot pass because another rank's copy was right. Every-rank-reads hashes each piece
// as it is read, while it is still in the CPU cache; share + exchange hashes them on a background thread once the
// exchange is done.
void read_and_verify(MpiComm& comm, hid_t f, const Offsets* offsets, const TensorPlan& p, const std::string& path,
                     const LoadOptions& options, ckpt::PhaseTimer& timer) {
  const bool verify = options.verify_checksums;
  ckpt::BackgroundHasher hasher(p.shared.size());
  const std::vector<char> verify_here(p.shared.size(), verify ? 1 : 0);
  const bool direct = options.strategy == LoadStrategy::kEveryRankReads && use_direct_io(comm, options.direct_io);
  read_tensors(comm, f, offsets, p.shared, options.strategy, direct, path, verify_here, hasher);
  // Sharded optimizer state: each rank reads (and verifies) exactly the datasets it owns, nothing else.
  ckpt::BackgroundHasher own_hasher(p.own.size());
  std::vector<char> own_verify(p.own.size(), verify ? 1 : 0);
  for (size_t i = 0; i < p.own.size(); ++i)
    if (!p.own[i].pieces.empty()) own_verify[i] = 0;  // verified by the chain below
  if (p.sharded) {
    const bool own_direct = use_direct_io(comm, options.direct_io);
    read_tensors(comm, f, offsets, p.own, LoadStrategy::kEveryRankReads, own_direct, path, own_verify, own_hasher);
  }
  timer.mark("read");
  std::string problems;
  if (verify) problems += verify_pieces(comm, p, path);

  const std::vector<uint64_t> hashed = hasher.finish();
  for (size_t i = 0; i < p.shared.size(); ++i)
    if (verify_here[i] && hashed[i] != p.shared[i].checksum)
      problems += "\n  R13: checksum mismatch in dataset " + p.shared[i].path;
  const std::vector<uint64_t> own_hashed = own_hasher.finish();
  for (size_t i = 0; i < p.own.size(); ++i)
    if (own_verify[i] && own_hashed[i] != p.own[i].checksum)
      problems += "\n  R13: checksum mismatch in dataset " + p.own[i].path;
  if (!problems.empty())
    problems = path + ": corrupt data on rank " + std::to_string(comm.rank()) + " (the bytes it read" +
               (options.strategy == LoadStrategy::kShareExchange ? " or received" : "") +
               " do not match the file's xxh3):" + problems;
  if (const std::string bools = bool_problems(p); !bools.empty())
    problems += (problems.empty() ? path + ": damaged (rank " + std::to_string(comm.rank()) + "):" : "") + bools;
  comm.rethrow_first(ckpt::checkpoint_error(problems));
  timer.mark("verify");
}

// Local. R1, R10, R11 on the counters read, and R8 on the Adam steps among `state_read` (the optimizer entries
// this rank read); throws CheckpointError (damage) listing the problems.
void check_values(const CheckpointManifest& m, const TrainState& loaded, const std::vector<TensorRef>& state_read,
                  const std::string& path) {
  ckpt::FileValues v;
  v.root_step = m.step;
  v.counters = loaded.counters;
  v.data = loaded.data;
  v.adam_steps = ckpt::adam_steps(state_read);
  const auto problems = ckpt::value_problems(path, v);
  if (!problems.empty()) throw CheckpointError(ckpt::joined_problems(problems));
}

// Local. What the file says besides the tensors, into the caller's state.
void apply_small_state(TrainState& state, TrainState&& loaded, const CheckpointManifest& m, int rank) {
  state.counters = loaded.counters;
  state.data = loaded.data;
  state.scheduler = std::move(loaded.scheduler);
  state.meta = std::move(loaded.meta);
  state.optimizer.type = m.optimizer_type;
  state.optimizer.groups = m.param_groups;
  state.rng_by_rank = std::move(loaded.rng_by_rank);
  state.saved_world_size = m.world_size;
  if (rank < m.world_size) state.rng = state.rng_by_rank[rank];
}

}  // namespace

void load_checkpoint(MpiComm& comm, const std::string& path, const LoadDestinations& destinations,
                     const LoadOptions& options) {
  ckpt::PhaseTimer timer;
  // Damage first (docs/FORMAT.md "Loading"): only a valid file can be another model. Rank 0 reads the metadata
  // and the small datasets, every rank verifies what it keeps of them.
  ckpt::LoadSource src = ckpt::read_load_source(comm, path);
  const CheckpointManifest& m = src.manifest;
  TrainState loaded = std::move(src.small);
  comm.rethrow_first(ckpt::checkpoint_error_of([&] { check_values(m, loaded, {}, path); }));
  timer.mark("manifest");
  TrainState& state = *agreed(comm, [&] { return &destinations(m); });
  std::vector<std::vector<ckpt::Segment>> pieces;
  check_destinations(comm, path, m, state, pieces);
  timer.mark("destinations");

  const TensorPlan plan = plan_tensors(state, m, std::move(pieces));
  if (src.raw) {  // the same on every rank: rank 0 decided it for the whole file
    read_and_verify(comm, -1, &src.offsets, plan, path, options, timer);
  } else {  // chunked, compressed, converted datasets (h5repack, other tools): through HDF5, every rank
    h5::Handle f = ckpt::open_checkpoint(&comm, path, options.mpiio_hints);
    read_and_verify(comm, f, nullptr, plan, path, options, timer);
  }
  comm.rethrow_first(ckpt::checkpoint_error_of([&] { check_values(m, loaded, state.optimizer.state, path); }));
  apply_small_state(state, std::move(loaded), m, comm.rank());
  timer.mark("small");
  log::debug("load " + path + ":" + timer.timeline());
}

void load_checkpoint(MpiComm& comm, const std::string& path, TrainState& state, const LoadOptions& options) {
  load_checkpoint(
      comm, path, [&](const CheckpointManifest&) -> TrainState& { return state; }, options);
}

}  // namespace h5ddp

// The checkpoint plan: which datasets a TrainState becomes, in which order, and which rank handles which
// rows. The share computations are pure functions (tested without MPI).
#include "checkpoint/plan.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "checkpoint/errors.hpp"
#include "checkpoint/hash.hpp"
#include "checkpoint/pieces.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"

namespace h5ddp::ckpt {

size_t DatasetPlan::nbytes() const {
  size_t n = string_size > 0 ? string_size : dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}
size_t DatasetPlan::rows() const {
  return shape.empty() ? 1 : static_cast<size_t>(shape[0]);
}
size_t DatasetPlan::row_bytes() const {
  return rows() == 0 ? 0 : nbytes() / rows();
}
h5::Handle DatasetPlan::file_type() const {
  return string_size > 0 ? h5::fixed_string_type(string_size) : h5::file_type(dtype);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<Segment> compute_segments(const std::vector<DatasetPlan>& datasets, int world) {
  uint64_t total = 0;
  for (const auto& d : datasets)
    if (d.owner < 0 && d.pieces.empty()) total += d.nbytes();
  // Share r covers global bytes [bound(r), bound(r+1)); a row belongs to the share holding its first byte.
  auto bound = [&](int r) -> uint64_t {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(total) * r) / world);
  };
  std::vector<Segment> out;
  uint64_t offset = 0;
  for (size_t i = 0; i < datasets.size(); ++i) {
    const uint64_t rows = datasets[i].rows(), rb = datasets[i].row_bytes(), n = datasets[i].nbytes();
    if (n == 0) continue;
    if (datasets[i].owner >= 0) {
      out.push_back(Segment{i, datasets[i].owner, 0, rows});
      continue;
    }
    if (!datasets[i].pieces.empty()) {
      for (const Segment& p : datasets[i].pieces)
        if (p.row_end > p.row_begin) out.push_back(Segment{i, p.rank, p.row_begin, p.row_end});
      continue;
    }
    // first_row(r): the first row whose first byte lies at or after bound(r).
    auto first_row = [&](int r) -> uint64_t {
      if (r >= world) return rows;
      const uint64_t b = bound(r);
      if (b <= offset) return 0;
      return std::min<uint64_t>(rows, (b - offset + rb - 1) / rb);
    };
    for (int r = 0; r < world; ++r) {
      const uint64_t begin = first_row(r), end = first_row(r + 1);
      if (end > begin) out.push_back(Segment{i, r, begin, end});
    }
    offset += n;
  }
  return out;
}

std::vector<int> assign_whole_datasets(const std::vector<DatasetPlan>& datasets, int world) {
  std::vector<size_t> order(datasets.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return datasets[a].nbytes() > datasets[b].nbytes(); });
  std::vector<uint64_t> load(world, 0);
  std::vector<int> owner(datasets.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[r] += datasets[i].nbytes() + 1;  // +1: spread empty datasets too
  }
  return owner;
}

namespace {

// `where`: a sharded tensor that rank `owner` holds (t.data is null on the other ranks), or one split in row
// pieces (t.data: this rank's rows, if it holds any).
DatasetPlan tensor_plan(const std::string& path, const TensorRef& t, const ShardPlacement& where = {}, int rank = -1) {
  DatasetPlan d;
  d.path = path;
  d.dtype = t.dtype;
  d.shape = t.shape;
  d.src = t.data;
  d.tensor = true;
  d.owner = where.pieces.empty() ? where.owner : -1;
  d.holders = where.holders;
  d.pieces = where.pieces;
  bool holds_piece = false;
  for (const Segment& s : d.pieces)
    if (s.rank == rank) d.src_row = s.row_begin, holds_piece = true;
  for (int64_t s : t.shape)
    if (s < 0) throw CheckpointError("tensor '" + t.name + "' has a negative dimension " + shape_string(t.shape));
  if (where.pieces.empty() && t.piece())
    throw CheckpointError("tensor '" + t.name + "' holds rows [" + std::to_string(t.row_begin) + ", " +
                          std::to_string(t.row_end) + ") only: row pieces are for a sharded optimizer's state");
  if (t.held_nbytes() > 0 && t.data == nullptr && (d.owner == rank || holds_piece))
    throw CheckpointError("tensor '" + t.name + "' has no data pointer");
  return d;
}

template <class T>
DatasetPlan scalar_plan(SavePlan& plan, const char* path, DType dtype, T value) {
  auto& buf = plan.storage.emplace_back(sizeof(T));
  std::memcpy(buf.data(), &value, sizeof(T));
  DatasetPlan d;
  d.path = path;
  d.dtype = dtype;
  d.src = buf.data();
  return d;
}

std::string hex_double(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%a", v);
  return b;
}

// `opt` is state.optimizer, or its merged form when sharded (then `placement` says where each entry is);
// `model` is state.model with its row pieces merged (then `model_placement` says where those are).
void add_local_datasets(SavePlan& plan, const TrainState& state, const OptimizerState& opt,
                        const std::vector<ShardPlacement>& placement, const std::vector<TensorRef>& model,
                        const std::vector<ShardPlacement>& model_placement, int rank) {
  std::set<std::string> seen;
  auto add = [&](DatasetPlan d) {
    if (!seen.insert(d.path).second) throw CheckpointError("two tensors map to the same dataset " + d.path);
    plan.datasets.push_back(std::move(d));
  };
  for (size_t i = 0; i < model.size(); ++i)
    add(tensor_plan(format::model_dataset(model[i].name), model[i], model_placement[i], rank));
  for (size_t i = 0; i < opt.state.size(); ++i)
    add(tensor_plan(format::optimizer_state_dataset(opt.state[i].name), opt.state[i],
                    placement.empty() ? ShardPlacement{} : placement[i], rank));
  for (const auto& t : state.user) add(tensor_plan(format::user_dataset(t.name), t));
  for (size_t g = 0; g < opt.groups.size(); ++g) {
    const auto& names = opt.groups[g].params;
    if (names.empty()) continue;
    size_t len = 1;
    for (const auto& n : names) len = std::max(len, n.size());
    auto& buf = plan.storage.emplace_back(names.size() * len, 0);
    for (size_t i = 0; i < names.size(); ++i) std::memcpy(buf.data() + i * len, names[i].data(), names[i].size());
    DatasetPlan d;
    d.path = format::param_group_path(g) + "/" + format::kParamNamesDataset;
    d.string_size = len;
    d.shape = {static_cast<int64_t>(names.size())};
    d.src = buf.data();
    add(std::move(d));
  }
  add(scalar_plan(plan, format::kTrainStep, DType::kI64, state.counters.step));
  add(scalar_plan(plan, format::kTrainEpoch, DType::kI64, state.counters.epoch));
  add(scalar_plan(plan, format::kTrainSamplesConsumed, DType::kI64, state.counters.samples_consumed));
  add(scalar_plan(plan, format::kDataSeed, DType::kU64, state.data.seed));
  add(scalar_plan(plan, format::kDataEpoch, DType::kI64, state.data.epoch));
  add(scalar_plan(plan, format::kDataPosition, DType::kI64, state.data.position));
  add(scalar_plan(plan, format::kDataGlobalBatch, DType::kI64, state.data.global_batch));
}

void add_rng_datasets(Comm& comm, SavePlan& plan, const TrainState& state) {
  auto add = [&](DatasetPlan d) { plan.datasets.push_back(std::move(d)); };
  // RNG rows differ per rank by design: gather them so every rank holds (and can checksum) the whole matrix.
  const int world = comm.size();
  uint64_t sizes[2] = {state.rng.cpu.size(), state.rng.cuda.size()};
  std::vector<uint64_t> all_sizes(2 * world);
  comm.allgather(sizes, all_sizes.data(), 2, DType::kU64);
  for (int which = 0; which < 2; ++which) {
    std::string seen_sizes;
    bool same = true;
    for (int r = 0; r < world; ++r) {
      same = same && all_sizes[2 * r + which] == all_sizes[which];
      seen_sizes +=
          (r ? ", " : "") + std::string("rank ") + std::to_string(r) + "=" + std::to_string(all_sizes[2 * r + which]);
    }
    if (!same)
      throw_agreed(DisagreementError(std::string("ranks disagree on the size of their ") + (which ? "CUDA" : "CPU") +
                                     " generator state: " + seen_sizes));
  }
  for (int which = 0; which < 2; ++which) {
    const auto& mine = which ? state.rng.cuda : state.rng.cpu;
    const uint64_t n = all_sizes[which];
    if (which == 1 && n == 0) continue;  // /rng/cuda only when there is one
    auto& buf = plan.storage.emplace_back(n * world);
    if (n) comm.allgather(mine.data(), buf.data(), n, DType::kU8);
    DatasetPlan d;
    d.path = which ? format::kRngCuda : format::kRngCpu;
    d.dtype = DType::kU8;
    d.shape = {world, static_cast<int64_t>(n)};
    d.src = buf.data();
    add(std::move(d));
  }
}

}  // namespace

namespace {

// One rank's share of a sharded optimizer, as one text: group count, then "G<group> <param>" lines, then
// "S<dtype> <dims> <shape...> <row_begin> <row_end> <entry>" lines (row_end -1: the whole tensor).
std::string describe_shard(const OptimizerState& opt) {
  std::string out = std::to_string(opt.groups.size()) + "\n";
  for (size_t g = 0; g < opt.groups.size(); ++g)
    for (const auto& n : opt.groups[g].params) out += "G" + std::to_string(g) + " " + n + "\n";
  for (const auto& t : opt.state) {
    out += "S" + std::string(dtype_name(t.dtype)) + " " + std::to_string(t.shape.size());
    for (int64_t d : t.shape) out += " " + std::to_string(d);
    out += " " + std::to_string(t.piece() ? t.row_begin : 0) + " " + std::to_string(t.piece() ? t.row_end : -1);
    out += " " + t.name + "\n";
  }
  return out;
}

// Collective. Every rank's text, indexed by rank (two allgathers: lengths, then the padded texts).
std::vector<std::string> allgather_strings(Comm& comm, std::string mine) {
  const int world = comm.size();
  uint64_t len = mine.size();
  std::vector<uint64_t> lens(world);
  comm.allgather(&len, lens.data(), 1, DType::kU64);
  const uint64_t max_len = *std::max_element(lens.begin(), lens.end());
  mine.resize(max_len, '\0');
  std::string all(max_len * world, '\0');
  if (max_len) comm.allgather(mine.data(), all.data(), max_len, DType::kU8);
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) out.push_back(all.substr(r * max_len, lens[r]));
  return out;
}

// The ranks' shards as read back from their texts: one entry per state name, with every rank's listing of it.
struct ShardListing {
  struct Entry {
    TensorRef ref;  // this rank's own listing where it has one (data, rows), else the first rank's (no data)
    std::vector<Segment> listed;  // (rank, rows) per listing rank; rows [0, rows) for a whole listing
    bool any_piece = false;
  };
  std::vector<Entry> entries;                                    // in first-listed order
  std::vector<std::vector<std::pair<std::string, int>>> groups;  // per group: (parameter, rank)
  std::string problems;                                          // one line each
  std::map<std::string, size_t> index;
};

// One "S..." line of rank r's text; the data pointer is this rank's own where the entry is its own.
TensorRef parse_state_line(const std::string& line, int r, int rank, const std::vector<TensorRef>& own) {
  std::istringstream f(line.substr(1));
  std::string dtype;
  size_t dims = 0;
  TensorRef t;
  f >> dtype >> dims;
  t.dtype = dtype_from_name(dtype);
  t.shape.resize(dims);
  for (auto& d : t.shape) f >> d;
  f >> t.row_begin >> t.row_end;
  f.get();
  std::getline(f, t.name);
  if (r == rank)
    for (const auto& mine : own)
      if (mine.name == t.name) t.data = mine.data;
  return t;
}

void add_listing(ShardListing& out, TensorRef t, int r, int rank) {
  const bool piece = t.piece();
  const Segment rows{0, r, piece ? static_cast<uint64_t>(t.row_begin) : 0,
                     piece ? static_cast<uint64_t>(t.row_end) : static_cast<uint64_t>(t.rows())};
  auto [it, fresh] = out.index.emplace(t.name, out.entries.size());
  if (fresh) {
    out.entries.push_back(ShardListing::Entry{std::move(t), {rows}, piece});
    return;
  }
  ShardListing::Entry& e = out.entries[it->second];
  if (e.ref.dtype != t.dtype || e.ref.shape != t.shape) {
    out.problems += "\n    " + t.name + " is " + dtype_name(t.dtype) + " " + shape_string(t.shape) + " on rank " +
                    std::to_string(r) + ", " + dtype_name(e.ref.dtype) + " " + shape_string(e.ref.shape) + " on rank " +
                    std::to_string(e.listed.front().rank);
    return;
  }
  e.listed.push_back(rows);
  e.any_piece = e.any_piece || piece;
  if (r == rank) e.ref = std::move(t);
}

// Adds rank r's text to `out` (group count checked against rank 0's).
void parse_shard(const std::string& text, int r, int rank, const std::vector<TensorRef>& own, ShardListing& out) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  const size_t g_count = std::stoull(line);
  if (r == 0) {
    out.groups.resize(g_count);
  } else if (g_count != out.groups.size()) {
    out.problems += "\n    rank " + std::to_string(r) + " has " + std::to_string(g_count) +
                    " param groups, rank 0 has " + std::to_string(out.groups.size());
    return;
  }
  while (std::getline(in, line)) {
    if (line[0] == 'G') {
      std::istringstream f(line.substr(1));
      size_t g = 0;
      std::string name;
      f >> g;
      f.get();
      std::getline(f, name);
      out.groups[g].emplace_back(name, r);
      continue;
    }
    TensorRef t = parse_state_line(line, r, rank, own);
    if (!t.name.empty()) add_listing(out, std::move(t), r, rank);
  }
}

// Where each listed entry goes: whole entries to the lowest rank listing them (a whole entry that several ranks
// list, e.g. Adam's step of a parameter split between them, holds the same value on each); split entries in
// their ranks' pieces, which must tile the tensor.
void place_entries(ShardListing& listing, std::vector<ShardPlacement>& placement) {
  std::vector<EntryListing> check;
  for (const auto& e : listing.entries) check.push_back(EntryListing{e.ref.name, e.ref.rows(), e.any_piece, e.listed});
  listing.problems += listing_problems(check, "    ");
  placement.clear();
  for (auto& e : listing.entries) {
    ShardPlacement p;
    if (!e.any_piece) {
      p.owner = e.listed.front().rank;
      for (const Segment& s : e.listed) p.owner = std::min(p.owner, s.rank), p.holders.push_back(s.rank);
    } else {
      for (const Segment& s : e.listed)  // a rank holding none of the rows lists an empty piece (stage 3's model)
        if (s.row_end > s.row_begin) p.pieces.push_back(s);
      std::sort(p.pieces.begin(), p.pieces.end(),
                [](const Segment& a, const Segment& b) { return a.row_begin < b.row_begin; });
    }
    placement.push_back(std::move(p));
  }
}

}  // namespace

OptimizerState merge_optimizer_shards(Comm& comm, const TrainState& state, std::vector<ShardPlacement>& placement) {
  const std::vector<std::string> texts = allgather_strings(comm, describe_shard(state.optimizer));
  ShardListing listing;
  for (int r = 0; r < comm.size(); ++r) parse_shard(texts[r], r, comm.rank(), state.optimizer.state, listing);
  if (listing.problems.empty()) place_entries(listing, placement);

  // The model's order (registration order) orders the merged lists, as a replicated optimizer lists them.
  std::map<std::string, size_t> model_index;
  for (size_t i = 0; i < state.model.size(); ++i) model_index.emplace(state.model[i].name, i);
  auto position = [&](const std::string& param) {
    auto it = model_index.find(param);
    return it == model_index.end() ? state.model.size() : it->second;
  };
  OptimizerState out;
  out.type = state.optimizer.type;
  out.sharded = true;
  std::string& problems = listing.problems;
  for (size_t g = 0; g < listing.groups.size() && problems.empty(); ++g) {
    auto& names = listing.groups[g];
    std::stable_sort(names.begin(), names.end(),
                     [&](const auto& a, const auto& b) { return position(a.first) < position(b.first); });
    ParamGroup pg;
    pg.hyper = state.optimizer.groups[g].hyper;
    for (size_t i = 0; i < names.size(); ++i)  // a parameter split between ranks is in each one's optimizer
      if (i == 0 || names[i].first != names[i - 1].first) pg.params.push_back(names[i].first);
    out.groups.push_back(std::move(pg));
  }
  if (!problems.empty())
    throw_agreed(DisagreementError(
        "the ranks' optimizer shards do not partition the optimizer state; no file written:" + problems));
  auto param_of = [](const std::string& entry) { return entry.substr(0, entry.rfind('/')); };
  std::vector<size_t> order(listing.entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return position(param_of(listing.entries[a].ref.name)) < position(param_of(listing.entries[b].ref.name));
  });
  std::vector<ShardPlacement> sorted;
  for (size_t i : order) {
    TensorRef ref = listing.entries[i].ref;
    if (!placement[i].pieces.empty() && !ref.piece() && ref.data != nullptr)
      ref.row_begin = 0, ref.row_end = ref.rows();
    out.state.push_back(std::move(ref));
    sorted.push_back(std::move(placement[i]));
  }
  placement = std::move(sorted);
  return out;
}

std::vector<TensorRef> merge_model_pieces(Comm& comm, const TrainState& state, std::vector<ShardPlacement>& placement) {
  std::vector<TensorRef> out = state.model;
  placement.assign(out.size(), ShardPlacement{});
  if (!comm.agree(model_is_sharded(state) ? 1 : 0))
    throw_agreed(DisagreementError("some ranks hold the model in row pieces (shard stage 3) and others whole"));
  if (!model_is_sharded(state)) return out;
  OptimizerState pieces;  // the model tensors held in row pieces, listed as a shard is (no groups)
  for (const auto& t : state.model)
    if (t.row_end >= 0) pieces.state.push_back(t);
  const std::vector<std::string> texts = allgather_strings(comm, describe_shard(pieces));
  ShardListing listing;
  for (int r = 0; r < comm.size(); ++r) parse_shard(texts[r], r, comm.rank(), pieces.state, listing);
  std::vector<ShardPlacement> where;
  if (listing.problems.empty()) place_entries(listing, where);
  if (!listing.problems.empty())
    throw_agreed(DisagreementError("the ranks' row pieces of the model do not partition it; no file written:" +
                                   listing.problems));
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].row_end < 0) continue;
    auto it = listing.index.find(out[i].name);
    if (it == listing.index.end())  // every rank lists every piece (some empty): the same names everywhere
      throw CheckpointError("model tensor '" + out[i].name + "' is missing from the ranks' listing");
    placement[i] = where[it->second];
    if (!placement[i].pieces.empty() && out[i].held_nbytes() > 0 && !out[i].piece())
      out[i].row_begin = 0, out[i].row_end = out[i].rows();
  }
  return out;
}

SavePlan make_save_plan(Comm& comm, const TrainState& state) {
  SavePlan plan;
  OptimizerState merged;
  std::vector<ShardPlacement> owners, model_placement;
  if (state.optimizer.sharded) merged = merge_optimizer_shards(comm, state, owners);
  const OptimizerState& opt = state.optimizer.sharded ? merged : state.optimizer;
  const std::vector<TensorRef> model = merge_model_pieces(comm, state, model_placement);
  // Local part first (it may throw on a bad name); agree on its outcome before the collective part.
  comm.rethrow_first(
      checkpoint_error_of([&] { add_local_datasets(plan, state, opt, owners, model, model_placement, comm.rank()); }));
  add_rng_datasets(comm, plan, state);

  std::string desc;
  for (auto& d : plan.datasets) {
    if (!d.tensor) d.checksum = hash_bytes(d.src, d.nbytes());
    desc += d.path + "|" + (d.string_size ? "str" + std::to_string(d.string_size) : dtype_name(d.dtype)) + "|" +
            shape_string(d.shape) + "\n";
  }
  desc += "optimizer=" + opt.type + "\n";
  for (const auto& g : opt.groups)
    for (const auto& [k, v] : g.hyper) desc += "hyper " + k + "=" + hex_double(v) + "\n";
  desc += "scheduler=" + state.scheduler.type + "\n";
  for (const auto& [k, v] : state.scheduler.values) desc += "sched " + k + "=" + hex_double(v) + "\n";
  for (const auto& [k, v] : state.meta) desc += "meta " + k + "=" + v + "\n";
  plan.structure_hash = hash_bytes(desc.data(), desc.size());
  plan.optimizer = opt;
  return plan;
}

}  // namespace h5ddp::ckpt

// read_load_source: rank 0 reads a checkpoint's metadata and small datasets once, every rank gets them in one
// broadcast (load_source.hpp).
#include "checkpoint/load_source.hpp"

#include <cstring>

#include "checkpoint/errors.hpp"
#include "checkpoint/fault_inject.hpp"
#include "checkpoint/hash.hpp"
#include "checkpoint/phase_timer.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/rows.hpp"
#include "checkpoint/rules.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"

namespace h5ddp::ckpt {
namespace {

// Appends fixed-width little-endian integers and length-prefixed strings.
class WireOut {
 public:
  void u64(uint64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    s_.append(b, 8);
  }
  void f64(double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    u64(u);
  }
  void str(const std::string& v) {
    u64(v.size());
    s_ += v;
  }
  void bytes(const std::vector<uint8_t>& v) {
    u64(v.size());
    s_.append(reinterpret_cast<const char*>(v.data()), v.size());
  }
  void shape(const std::vector<int64_t>& v) {
    u64(v.size());
    for (int64_t d : v) u64(static_cast<uint64_t>(d));
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

class WireIn {
 public:
  WireIn(const std::string& s, const std::string& path) : s_(s), path_(path) {}
  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(s_[at_ + i])) << (8 * i);
    at_ += 8;
    return v;
  }
  double f64() {
    const uint64_t u = u64();
    double v;
    std::memcpy(&v, &u, 8);
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    need(n);
    std::string v = s_.substr(at_, n);
    at_ += n;
    return v;
  }
  std::vector<uint8_t> bytes() {
    const std::string v = str();
    return std::vector<uint8_t>(v.begin(), v.end());
  }
  std::vector<int64_t> shape() {
    std::vector<int64_t> v(u64());
    for (auto& d : v) d = static_cast<int64_t>(u64());
    return v;
  }
  size_t count() {  // an element count, bounded by the bytes left (each element takes at least 8)
    const uint64_t n = u64();
    if (n > (s_.size() - at_) / 8) need(s_.size() + 1);
    return n;
  }
  void finish() const {
    if (at_ != s_.size())
      throw CheckpointError(path_ + ": the load manifest has " + std::to_string(s_.size() - at_) +
                            " bytes left over (h5ddp versions differ between ranks?)");
  }

 private:
  void need(uint64_t n) const {
    if (n > s_.size() - at_ || n > s_.size())
      throw CheckpointError(path_ + ": the load manifest ends early (h5ddp versions differ between ranks?)");
  }
  const std::string& s_;
  const std::string& path_;
  size_t at_ = 0;
};

void put_tensors(WireOut& w, const std::vector<TensorInfo>& list) {
  w.u64(list.size());
  for (const auto& t : list) {
    w.str(t.name);
    w.u64(static_cast<uint64_t>(t.dtype));
    w.shape(t.shape);
    w.u64(t.checksum);
  }
}

std::vector<TensorInfo> get_tensors(WireIn& r) {
  std::vector<TensorInfo> out(r.count());
  for (auto& t : out) {
    t.name = r.str();
    t.dtype = static_cast<DType>(r.u64());
    t.shape = r.shape();
    t.checksum = r.u64();
  }
  return out;
}

void put_manifest(WireOut& w, const CheckpointManifest& m) {
  w.u64(static_cast<uint64_t>(m.format_version));
  w.u64(static_cast<uint64_t>(m.step));
  w.u64(static_cast<uint64_t>(m.world_size));
  for (const auto* s : {&m.h5ddp_version, &m.torch_version, &m.created, &m.optimizer_type}) w.str(*s);
  w.u64(m.param_groups.size());
  for (const auto& g : m.param_groups) {
    w.u64(g.hyper.size());
    for (const auto& [k, v] : g.hyper) w.str(k), w.f64(v);
    w.u64(g.params.size());
    for (const auto& p : g.params) w.str(p);
  }
  for (const auto* list : {&m.model, &m.optimizer_state, &m.user}) put_tensors(w, *list);
  w.u64(m.rng_cpu_bytes);
  w.u64(m.rng_cuda_bytes);
  w.u64(m.tensor_bytes);
}

CheckpointManifest get_manifest(WireIn& r, const std::string& path) {
  CheckpointManifest m;
  m.path = path;
  m.format_version = static_cast<int>(r.u64());
  m.step = static_cast<int64_t>(r.u64());
  m.world_size = static_cast<int>(r.u64());
  for (auto* s : {&m.h5ddp_version, &m.torch_version, &m.created, &m.optimizer_type}) *s = r.str();
  m.param_groups.resize(r.count());
  for (auto& g : m.param_groups) {
    for (size_t n = r.count(); n > 0; --n) {
      std::string k = r.str();
      g.hyper[k] = r.f64();
    }
    g.params.resize(r.count());
    for (auto& p : g.params) p = r.str();
  }
  for (auto* list : {&m.model, &m.optimizer_state, &m.user}) *list = get_tensors(r);
  m.rng_cpu_bytes = r.u64();
  m.rng_cuda_bytes = r.u64();
  m.tensor_bytes = r.u64();
  return m;
}

void put_strings(WireOut& w, const std::map<std::string, std::string>& m) {
  w.u64(m.size());
  for (const auto& [k, v] : m) w.str(k), w.str(v);
}

std::map<std::string, std::string> get_strings(WireIn& r) {
  std::map<std::string, std::string> out;
  for (size_t n = r.count(); n > 0; --n) {
    std::string k = r.str();
    out[k] = r.str();
  }
  return out;
}

}  // namespace

std::string encode_load_source(const LoadSource& s, const std::vector<SmallDataset>& small) {
  WireOut w;
  put_manifest(w, s.manifest);
  w.u64(small.size());
  for (const auto& d : small) {
    w.str(d.plan.path);
    w.u64(static_cast<uint64_t>(d.plan.dtype));
    w.shape(d.plan.shape);
    w.u64(d.plan.checksum);
    w.bytes(d.bytes);
  }
  w.str(s.small.scheduler.type);
  w.u64(s.small.scheduler.values.size());
  for (const auto& [k, v] : s.small.scheduler.values) w.str(k), w.f64(v);
  put_strings(w, s.small.meta);
  w.u64(s.offsets.size());
  for (const auto& [k, v] : s.offsets) w.str(k), w.u64(v);
  w.u64(s.raw ? 1 : 0);
  return w.take();
}

LoadSource decode_load_source(const std::string& wire, const std::string& path, std::vector<SmallDataset>* small) {
  WireIn r(wire, path);
  LoadSource s;
  s.manifest = get_manifest(r, path);
  small->resize(r.count());
  for (auto& d : *small) {
    d.plan.path = r.str();
    d.plan.dtype = static_cast<DType>(r.u64());
    d.plan.shape = r.shape();
    d.plan.checksum = r.u64();
    d.bytes = r.bytes();
  }
  s.small.scheduler.type = r.str();
  for (size_t n = r.count(); n > 0; --n) {
    std::string k = r.str();
    s.small.scheduler.values[k] = r.f64();
  }
  s.small.meta = get_strings(r);
  for (size_t n = r.count(); n > 0; --n) {
    std::string k = r.str();
    s.offsets[k] = r.u64();
  }
  s.raw = r.u64() != 0;
  r.finish();
  return s;
}

namespace {

// Reads a small dataset whole through HDF5 (rank 0), verifying its checksum.
SmallDataset read_small(hid_t f, const std::string& path, const std::string& file) {
  return with_context("reading " + path + " from " + file, [&] {
    h5::SilenceErrors quiet;
    h5::Handle ds = h5::dataset(H5Dopen2(f, path.c_str(), H5P_DEFAULT));
    SmallDataset s;
    DatasetPlan& d = s.plan;
    d.path = path;
    d.dtype = dtype_from_name(h5::read_attr_string(ds, format::kAttrDtype));
    h5::Handle space = h5::dataspace(H5Dget_space(ds));
    d.shape = h5::space_shape(space);
    s.bytes.resize(d.nbytes());
    if (!s.bytes.empty()) read_rows(ds, d, 0, d.rows(), s.bytes.data(), H5P_DEFAULT);
    d.checksum = h5::read_attr_uint(ds, format::kAttrChecksum);
    if (hash_bytes(s.bytes.data(), s.bytes.size()) != d.checksum)
      throw CheckpointError(file + ": R13: checksum mismatch in dataset " + path);
    return s;
  });
}

// Scheduler and meta attributes (rank 0, through HDF5).
void read_attributes(hid_t f, const std::string& path, TrainState& s) {
  with_context("reading " + std::string(format::kSchedulerGroup) + " from " + path, [&] {
    h5::SilenceErrors quiet;
    h5::Handle g = h5::group(H5Gopen2(f, format::kSchedulerGroup, H5P_DEFAULT));
    for (const auto& a : h5::attr_names(g)) {
      if (a == format::kAttrSchedulerType)
        s.scheduler.type = h5::read_attr_string(g, a);
      else
        s.scheduler.values[a] = h5::read_attr_double(g, a);
    }
    h5::Handle meta = h5::group(H5Gopen2(f, format::kMetaGroup, H5P_DEFAULT));
    for (const auto& a : h5::attr_names(meta)) s.meta[a] = h5::read_attr_string(meta, a);
  });
}

// The offsets of the tensor datasets a plain read serves (ObjectFact::offset); `raw` when all have one.
void raw_offsets(const FileFacts& facts, LoadSource& s) {
  const CheckpointManifest& m = s.manifest;
  s.raw = true;
  auto add = [&](const std::string& path, const TensorInfo& t) {
    const ObjectFact* o = facts.find(path);
    if (o && o->offset != ObjectFact::kNoOffset && o->storage == t.nbytes() && o->type_matches)
      s.offsets[path] = o->offset;
    else if (t.nbytes() > 0)
      s.raw = false;
  };
  for (const auto& t : m.model) add(format::model_dataset(t.name), t);
  for (const auto& t : m.optimizer_state) add(format::optimizer_state_dataset(t.name), t);
  for (const auto& t : m.user) add(format::user_dataset(t.name), t);
}

// Rank 0: everything the other ranks need, encoded.
std::string read_on_reader(const std::string& path) {
  PhaseTimer tm;
  h5::Handle f = open_checkpoint(nullptr, path);
  tm.mark("open");
  const FileFacts facts = read_facts(f, path);
  tm.mark("facts");
  const auto problems = rule_problems(facts, nullptr);
  tm.mark("rules");
  if (!problems.empty()) throw CheckpointError(joined_problems(problems));
  LoadSource s;
  s.manifest = manifest_of(facts);
  std::vector<SmallDataset> small;
  for (const char* p : small_dataset_paths(s.manifest)) small.push_back(read_small(f, p, path));
  read_attributes(f, path, s.small);
  raw_offsets(facts, s);
  tm.mark("small+offsets");
  auto w = encode_load_source(s, small);
  tm.mark("encode");
  log::debug("load " + path + ": rank 0 read the metadata:" + tm.timeline());
  return w;
}

template <class T>
T scalar(const std::map<std::string, const SmallDataset*>& by_path, const char* name, const std::string& file) {
  const SmallDataset& d = *by_path.at(name);
  if (d.bytes.size() != sizeof(T)) throw CheckpointError(file + ": dataset " + name + " has the wrong size");
  T v;
  std::memcpy(&v, d.bytes.data(), sizeof(T));
  return v;
}

std::vector<RngState> rng_rows(const std::map<std::string, const SmallDataset*>& by_path, const CheckpointManifest& m,
                               const std::string& file) {
  std::vector<RngState> rows(m.world_size);
  for (int which = 0; which < 2; ++which) {
    const size_t n = which ? m.rng_cuda_bytes : m.rng_cpu_bytes;
    if (which == 1 && n == 0) continue;
    const SmallDataset& d = *by_path.at(which ? format::kRngCuda : format::kRngCpu);
    if (d.plan.shape.size() != 2 || d.plan.shape[0] != m.world_size || d.bytes.size() != n * m.world_size)
      throw CheckpointError(file + ": rng dataset has shape " + shape_string(d.plan.shape) + ", expected [" +
                            std::to_string(m.world_size) + ", n]");
    for (int r = 0; r < m.world_size; ++r) {
      auto& dst = which ? rows[r].cuda : rows[r].cpu;
      dst.assign(d.bytes.begin() + r * n, d.bytes.begin() + (r + 1) * n);
    }
  }
  return rows;
}

// Every rank: the small datasets' bytes verified against their xxh3 (in this rank's memory), then parsed.
void small_state_of(const std::vector<SmallDataset>& small, LoadSource& s, int rank, const std::string& file) {
  std::map<std::string, const SmallDataset*> by_path;
  for (const auto& d : small) {
    if (hash_bytes(d.bytes.data(), d.bytes.size()) != d.plan.checksum)
      throw CheckpointError(file + ": R13: checksum mismatch in dataset " + d.plan.path + " on rank " +
                            std::to_string(rank) + " (the bytes rank 0 read and sent)");
    by_path[d.plan.path] = &d;
  }
  for (const char* p : small_dataset_paths(s.manifest))
    if (!by_path.count(p)) throw CheckpointError(file + ": required dataset " + std::string(p) + " is missing");
  TrainState& t = s.small;
  t.counters.step = scalar<int64_t>(by_path, format::kTrainStep, file);
  t.counters.epoch = scalar<int64_t>(by_path, format::kTrainEpoch, file);
  t.counters.samples_consumed = scalar<int64_t>(by_path, format::kTrainSamplesConsumed, file);
  t.data.seed = scalar<uint64_t>(by_path, format::kDataSeed, file);
  t.data.epoch = scalar<int64_t>(by_path, format::kDataEpoch, file);
  t.data.position = scalar<int64_t>(by_path, format::kDataPosition, file);
  t.data.global_batch = scalar<int64_t>(by_path, format::kDataGlobalBatch, file);
  t.rng_by_rank = rng_rows(by_path, s.manifest, file);
}

}  // namespace

std::vector<const char*> small_dataset_paths(const CheckpointManifest& m) {
  std::vector<const char*> out = {format::kTrainStep,       format::kTrainEpoch, format::kTrainSamplesConsumed,
                                  format::kDataSeed,        format::kDataEpoch,  format::kDataPosition,
                                  format::kDataGlobalBatch, format::kRngCpu};
  if (m.rng_cuda_bytes) out.push_back(format::kRngCuda);
  return out;
}

LoadSource read_load_source(MpiComm& comm, const std::string& path) {
  std::string wire;
  comm.rethrow_first(checkpoint_error_of([&] {
    if (comm.rank() == 0) wire = read_on_reader(path);
  }));
  maybe_inject_fault("load_after_manifest", comm.rank());  // test hook: a rank dies before the broadcast
  wire = comm.broadcast_string(wire, 0);
  LoadSource s;
  comm.rethrow_first(checkpoint_error_of([&] {
    std::vector<SmallDataset> small;
    s = decode_load_source(wire, path, &small);
    small_state_of(small, s, comm.rank(), path);
  }));
  log::debug("load " + path + ": manifest of " + std::to_string(wire.size()) + " bytes from rank 0, " +
             std::to_string(s.offsets.size()) + " raw offsets" + (s.raw ? "" : " (some datasets are not raw)"));
  return s;
}

}  // namespace h5ddp::ckpt

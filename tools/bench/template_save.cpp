// h5ddp-bench-template-save: issue 59's "template" save, measured (a prototype outside the library; no LibTorch).
// A checkpoint written by h5ddp (FILE) becomes a template once: every dataset's data extent, the metadata around
// them (kept in memory), and the byte offset of each dataset's `xxh3` attribute value and of the root `step`.
// A save through the template then writes a new file without HDF5: ftruncate, the metadata bytes, each dataset's
// bytes from memory, its XXH3 patched in place, fsync, rename, fsync of the directory.
//
//   h5ddp-bench-template-save FILE OUT [--reps R] [--warmup 0|1] [--flip-every K] [--fsync 0|1] [--bad-hash 0|1]
//                                      [--ranks-split N]
// The state saved is FILE's data bytes (read into memory once); before each save one byte of every K-th float tensor
// is flipped (K=7 by default), so their checksums change, and the step counters (root attribute, /train/step, Adam's
// steps) grow by 1. --bad-hash 1 patches a wrong checksum into the first flipped dataset (h5ddp-ckpt verify must
// refuse the file). Under mpirun -np N every process builds the template and holds the state; each hashes and
// writes its share of the datasets and metadata (cut by bytes in file order), the hashes are exchanged
// (MPI_Allreduce), every process fsyncs, the first renames. --ranks-split T: each process's share is cut again
// into T threads. Prints "RESULT op=... method=template seconds=..." lines (the first process's times, save:
// barrier to barrier) and what it found.
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "checkpoint/hash.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Dataset {
  std::string path;
  uint64_t offset = 0, size = 0;  // the data extent in the file
  uint64_t xxh3 = 0;              // the stored attribute value
  uint64_t attr_at = 0;           // file offset of that value
  uint64_t arena_at = 0;          // where its bytes are in memory
};

struct Template {
  uint64_t file_size = 0;
  std::vector<Dataset> datasets;  // by file offset
  // Metadata: the file's bytes outside every data extent, in gaps [offset, offset + bytes.size()).
  std::vector<std::pair<uint64_t, std::vector<char>>> gaps;
  // The parts of the gaps a save writes: (file offset, length) of runs that are not all zero.
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  int64_t step = 0;
  uint64_t step_at = 0;          // 0: not located
  std::string created;           // the root attribute, to count where it occurs
  uint64_t created_at = 0;       // file offset of its bytes when found exactly once, else 0
  std::vector<uint64_t> mtimes;  // file offsets of the objects' modification times (uint32 seconds)
  uint64_t metadata_bytes = 0, written_metadata_bytes = 0;
};

struct SaveTimes {
  double hash = 0, patch = 0, write = 0, fsync = 0, commit = 0, total = 0;
};

struct Options {
  std::string file, out;
  int reps = 3, warmup = 1, flip_every = 7, split = 1;
  int rank = 0, world = 1;  // MPI: under mpirun -np N, each process writes its share
  bool fsync = true, bad_hash = false;
};

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void pread_all(int fd, char* p, uint64_t n, uint64_t at) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(at));
    check(r > 0, "pread failed");
    p += r, n -= r, at += r;
  }
}

size_t g_timed_objects = 0;  // datasets whose object header carries times (H5Pset_obj_track_times on)

// Every dataset of the file: path, contiguous allocated extent, stored xxh3; refuses anything else.
herr_t visit(hid_t root, const char* name, const H5O_info_t* info, void* out) {
  if (info->type != H5O_TYPE_DATASET) return 0;
  g_timed_objects += info->ctime != 0 || info->mtime != 0;
  Dataset d;
  d.path = std::string("/") + name;
  const hid_t ds = H5Dopen2(root, name, H5P_DEFAULT);
  const hid_t dcpl = H5Dget_create_plist(ds), type = H5Dget_type(ds), space = H5Dget_space(ds);
  const bool contiguous = H5Pget_layout(dcpl) == H5D_CONTIGUOUS;
  const haddr_t at = H5Dget_offset(ds);
  d.size = H5Dget_storage_size(ds);
  const uint64_t expect = H5Tget_size(type) * static_cast<uint64_t>(H5Sget_simple_extent_npoints(space));
  const hid_t attr = H5Aopen(ds, "xxh3", H5P_DEFAULT);
  const bool read = attr >= 0 && H5Aread(attr, H5T_NATIVE_UINT64, &d.xxh3) >= 0;
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(space), H5Tclose(type), H5Pclose(dcpl), H5Dclose(ds);
  check(contiguous && at != HADDR_UNDEF && d.size == expect && expect > 0,
        d.path + ": not a contiguous, allocated, non-empty dataset: no template");
  check(read, d.path + ": no xxh3 attribute");
  d.offset = at;
  static_cast<std::vector<Dataset>*>(out)->push_back(d);
  return 0;
}

void read_structure(const std::string& file, Template& t) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  check(f >= 0, file + ": cannot open with HDF5");
  check(H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &t.datasets, H5O_INFO_BASIC | H5O_INFO_TIME) >= 0,
        "H5Ovisit2 failed");
  const hid_t a = H5Aopen(f, "step", H5P_DEFAULT);
  check(a >= 0 && H5Aread(a, H5T_NATIVE_INT64, &t.step) >= 0, file + ": no root step");
  H5Aclose(a);
  const hid_t c = H5Aopen(f, "created", H5P_DEFAULT), str = H5Aget_type(c);
  if (H5Tis_variable_str(str) > 0) {
    char* text = nullptr;
    if (H5Aread(c, str, &text) >= 0 && text) t.created = text;
    if (text) H5free_memory(text);
  } else {
    t.created.assign(H5Tget_size(str), '\0');
    if (H5Aread(c, str, t.created.data()) < 0) t.created.clear();
    t.created.resize(std::strlen(t.created.c_str()));
  }
  H5Tclose(str);
  if (c >= 0) H5Aclose(c);
  H5Fclose(f);
  std::sort(t.datasets.begin(), t.datasets.end(), [](auto& x, auto& y) { return x.offset < y.offset; });
  for (size_t i = 1; i < t.datasets.size(); ++i)
    check(t.datasets[i - 1].offset + t.datasets[i - 1].size <= t.datasets[i].offset, "data extents overlap");
}

// The metadata: every byte outside the data extents, read into t.gaps.
void read_metadata(const std::string& file, Template& t) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, file + ": cannot open");
  struct stat st {};
  ::fstat(fd, &st);
  t.file_size = static_cast<uint64_t>(st.st_size);
  uint64_t at = 0;
  auto gap = [&](uint64_t end) {
    if (end > at) {
      t.gaps.emplace_back(at, std::vector<char>(end - at));
      pread_all(fd, t.gaps.back().second.data(), end - at, at);
      t.metadata_bytes += end - at;
    }
  };
  for (const auto& d : t.datasets) {
    gap(d.offset);
    at = d.offset + d.size;
  }
  gap(t.file_size);
  ::close(fd);
}

// Reads every dataset's bytes into one arena (the "state" the saves write) and checks their XXH3 against the
// stored attributes: the format's checksum is XXH3-64 of exactly these bytes.
std::vector<char> read_state(const std::string& file, Template& t) {
  uint64_t total = 0;
  for (auto& d : t.datasets) d.arena_at = total, total += d.size;
  std::vector<char> arena(total);
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  for (const auto& d : t.datasets) pread_all(fd, arena.data() + d.arena_at, d.size, d.offset);
  ::close(fd);
  size_t bad = 0;
  for (const auto& d : t.datasets) bad += h5ddp::ckpt::hash_bytes(arena.data() + d.arena_at, d.size) != d.xxh3;
  std::printf("INFO original hashes: %zu of %zu datasets equal their stored xxh3\n", t.datasets.size() - bad,
              t.datasets.size());
  check(bad == 0, "hash_bytes disagrees with stored xxh3 values");
  return arena;
}

// Calls f(file offset, 8-byte value) at every position of the metadata.
template <class F>
void each_window(const Template& t, F f) {
  for (const auto& [at, bytes] : t.gaps)
    for (size_t i = 0; i + 8 <= bytes.size(); ++i) {
      uint64_t v;
      std::memcpy(&v, bytes.data() + i, 8);
      f(at + i, v);
    }
}

// The search: how often each dataset's stored xxh3 value, the root step and the created string occur in
// the metadata. A value of one dataset found exactly once locates it; values several datasets share (identical
// contents: Adam's steps) cannot say which position is whose, so the probe (below) locates every value.
void count_values(Template& t) {
  std::unordered_map<uint64_t, std::pair<int, int>> seen;  // value -> (datasets holding it, occurrences)
  for (const auto& d : t.datasets) ++seen[d.xxh3].first;
  uint64_t step_count = 0;
  uint64_t step;
  std::memcpy(&step, &t.step, 8);
  each_window(t, [&](uint64_t, uint64_t v) {
    step_count += v == step;
    auto it = seen.find(v);
    if (it != seen.end()) ++it->second.second;
  });
  size_t unique = 0, shared = 0, missing = 0, other = 0;
  for (const auto& d : t.datasets) {
    const auto& [holders, found] = seen[d.xxh3];
    if (holders == 1 && found == 1)
      ++unique;
    else if (found == holders)
      ++shared;
    else if (found == 0)
      ++missing;
    else
      ++other;
  }
  size_t created = 0;
  for (const auto& [at, bytes] : t.gaps)
    for (auto it = bytes.begin(); !t.created.empty(); ++it) {
      it = std::search(it, bytes.end(), t.created.begin(), t.created.end());
      if (it == bytes.end()) break;
      ++created, t.created_at = at + static_cast<uint64_t>(it - bytes.begin());
    }
  if (created != 1) t.created_at = 0;
  std::printf(
      "INFO search: %zu datasets' xxh3 found exactly once; %zu share their value with other datasets (found as "
      "often as held); %zu not found; %zu found more often than held; root step %lld found %llu times; created "
      "'%s' found %zu times\n",
      unique, shared, missing, other, static_cast<long long>(t.step), static_cast<unsigned long long>(step_count),
      t.created.c_str(), created);
}

void write_gaps(const std::string& path, const Template& t) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  check(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(t.file_size)) == 0, path + ": cannot create");
  for (const auto& [at, bytes] : t.gaps)
    check(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(at)) == static_cast<ssize_t>(bytes.size()),
          path + ": short write");
  ::close(fd);
}

uint64_t marker(size_t i) {
  return 0xC0DEC0DE00000000ull | (i + 1);  // i == datasets.size(): the root step
}

// Writes marker(i) as dataset i's xxh3 (and the root step) with HDF5 into a copy of the metadata (no data).
void mark_with_hdf5(const std::string& path, const Template& t) {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_EARLIEST, H5F_LIBVER_V18);  // as the writers
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl);
  check(f >= 0, path + ": cannot open the probe with HDF5");
  for (size_t i = 0; i <= t.datasets.size(); ++i) {
    const bool root = i == t.datasets.size();
    const hid_t ds = root ? f : H5Dopen2(f, t.datasets[i].path.c_str(), H5P_DEFAULT);
    const hid_t a = H5Aopen(ds, root ? "step" : "xxh3", H5P_DEFAULT);
    const uint64_t m = marker(i);
    check(a >= 0 && H5Awrite(a, root ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64, &m) >= 0, "H5Awrite failed");
    H5Aclose(a);
    if (!root) H5Dclose(ds);
  }
  check(H5Fclose(f) >= 0, path + ": close failed");
  H5Pclose(fapl);
}

void show_difference(const std::vector<char>& a, const std::vector<char>& b, uint64_t base, size_t i) {
  std::printf("INFO probe differs outside a marker at %llu:", static_cast<unsigned long long>(base + i));
  for (size_t k = i < 24 ? 0 : i - 24; k < std::min(a.size(), i + 8); ++k)
    std::printf(" %02x/%02x", a[k] & 0xff, b[k] & 0xff);
  std::printf("\n");
}

// Where byte i of metadata b lies in the seconds of an object modification time message (HDF5 object header v1
// message: type 0x0012, size 8, flags, 3 reserved; body: version 1, 3 reserved, uint32 seconds): the seconds'
// position, else SIZE_MAX. H5Awrite sets the object's time, so the probe's times differ from the template's.
size_t mtime_at(const std::vector<char>& b, size_t i) {
  static const unsigned char head[] = {0x12, 0, 8, 0};
  for (size_t p = i < 3 ? 0 : i - 3; p <= i; ++p) {
    if (p < 12 || p + 4 > b.size()) continue;
    const char* m = b.data() + p - 12;
    if (std::memcmp(m, head, 4) == 0 && m[5] == 0 && m[6] == 0 && m[7] == 0 && m[8] == 1 && m[9] == 0 && m[10] == 0 &&
        m[11] == 0)
      return p;
  }
  return SIZE_MAX;
}

// Locates every marker in the probe's metadata: each must occur exactly once, and the probe must differ from the
// template only inside the markers (else HDF5 moved or rewrote more than the values: no template).
void find_markers(Template& t, const std::vector<std::vector<char>>& probe, std::vector<uint64_t>& at) {
  const size_t n = t.datasets.size() + 1;
  std::vector<int> found(n, 0);
  std::vector<char> covered;
  uint64_t differing = 0, outside = 0;
  for (size_t g = 0; g < t.gaps.size(); ++g) {
    const auto& [base, bytes] = t.gaps[g];
    covered.assign(bytes.size(), 0);
    for (size_t i = 0; i + 8 <= bytes.size(); ++i) {
      uint64_t v;
      std::memcpy(&v, probe[g].data() + i, 8);
      if ((v >> 32) != (marker(0) >> 32) || (v & 0xFFFFFFFFull) == 0 || (v & 0xFFFFFFFFull) > n) continue;
      const size_t k = (v & 0xFFFFFFFFull) - 1;
      ++found[k], at[k] = base + i;
      std::fill(covered.begin() + i, covered.begin() + i + 8, 1);
    }
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] == probe[g][i] || covered[i]) {
        differing += bytes[i] != probe[g][i];
        continue;
      }
      ++differing;
      const size_t m = mtime_at(probe[g], i);
      if (m != SIZE_MAX) {
        if (t.mtimes.empty() || t.mtimes.back() != base + m) t.mtimes.push_back(base + m);
      } else if (++outside <= 3) {
        show_difference(bytes, probe[g], base, i);
      }
    }
  }
  size_t wrong = 0;
  for (size_t k = 0; k + 1 < n; ++k) wrong += found[k] != 1;
  std::printf(
      "INFO probe: %llu metadata bytes changed, %zu object modification times among them, %llu bytes "
      "elsewhere; %zu datasets' xxh3 not located exactly once; root step found %d times\n",
      static_cast<unsigned long long>(differing), t.mtimes.size(), static_cast<unsigned long long>(outside), wrong,
      found[n - 1]);
  check(outside == 0 && wrong == 0, "HDF5 changed more than the attribute values: no template");
  if (found[n - 1] != 1) at[n - 1] = 0;
}

// The parts of the metadata a save writes: everything but zero runs of 4 KiB or more (holes after ftruncate).
// Computed from the probe, whose checksum positions hold non-zero markers.
void make_pieces(Template& t, const std::vector<std::vector<char>>& probe) {
  constexpr size_t kHole = 4096;
  for (size_t g = 0; g < t.gaps.size(); ++g) {
    const auto& b = probe[g];
    size_t i = 0;
    while (i < b.size()) {
      size_t start = i, zeros = 0, end = i;
      for (; i < b.size() && zeros < kHole; ++i) {
        zeros = b[i] == 0 ? zeros + 1 : 0;
        if (b[i] != 0) end = i + 1;
      }
      if (end > start) t.pieces.emplace_back(t.gaps[g].first + start, end - start);
      while (i < b.size() && b[i] == 0) ++i;
    }
  }
  for (const auto& p : t.pieces) t.written_metadata_bytes += p.second;
}

void locate(const std::string& probe_path, Template& t) {
  write_gaps(probe_path, t);
  mark_with_hdf5(probe_path, t);
  const int fd = ::open(probe_path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  ::fstat(fd, &st);
  check(static_cast<uint64_t>(st.st_size) == t.file_size, "the probe changed size: no template");
  std::vector<std::vector<char>> probe;
  for (const auto& [at, bytes] : t.gaps) {
    probe.emplace_back(bytes.size());
    pread_all(fd, probe.back().data(), bytes.size(), at);
  }
  ::close(fd);
  std::filesystem::remove(probe_path);
  std::vector<uint64_t> at(t.datasets.size() + 1, 0);
  find_markers(t, probe, at);
  for (size_t i = 0; i < t.datasets.size(); ++i) t.datasets[i].attr_at = at[i];
  t.step_at = at.back();
  make_pieces(t, probe);
}

char* gap_pointer(Template& t, uint64_t at) {
  auto it = std::upper_bound(t.gaps.begin(), t.gaps.end(), at, [](uint64_t a, const auto& g) { return a < g.first; });
  check(it != t.gaps.begin(), "patch position outside the metadata");
  --it;
  check(at + 8 <= it->first + it->second.size(), "patch position outside the metadata");
  return it->second.data() + (at - it->first);
}

struct Segment {
  uint64_t at;
  const char* p;
  uint64_t n;
};

// Everything a save writes, in file order: the metadata pieces (from the template's gaps, patched in place) and
// every dataset's bytes (from the arena).
std::vector<Segment> segments(Template& t, const std::vector<char>& arena) {
  std::vector<Segment> out;
  for (const auto& [at, n] : t.pieces) out.push_back({at, gap_pointer(t, at), n});
  for (const auto& d : t.datasets) out.push_back({d.offset, arena.data() + d.arena_at, d.size});
  std::sort(out.begin(), out.end(), [](const Segment& a, const Segment& b) { return a.at < b.at; });
  return out;
}

// [begin, end) cut into `parts` runs of about equal bytes; weight(i) is item i's bytes.
template <class W>
std::vector<size_t> shares(size_t count, size_t parts, W weight) {
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) total += weight(i);
  std::vector<size_t> edge{0};
  uint64_t sum = 0;
  for (size_t i = 0; i < count && edge.size() < parts; ++i) {
    sum += weight(i);
    if (sum * parts >= total * edge.size()) edge.push_back(i + 1);
  }
  while (edge.size() <= parts) edge.push_back(count);
  edge.back() = count;
  return edge;
}

// Writes segments [b, e) with pwritev, one call per run of adjacent segments (at most IOV_MAX each).
void write_run(int fd, const std::vector<Segment>& segs, size_t b, size_t e) {
  std::vector<iovec> iov;
  while (b < e) {
    iov.clear();
    const uint64_t at = segs[b].at;
    uint64_t n = 0;
    for (; b < e && iov.size() < IOV_MAX && segs[b].at == at + n; ++b, n += segs[b - 1].n)
      iov.push_back({const_cast<char*>(segs[b].p), segs[b].n});
    const ssize_t w = ::pwritev(fd, iov.data(), static_cast<int>(iov.size()), static_cast<off_t>(at));
    check(w == static_cast<ssize_t>(n), "pwritev failed or wrote short (the prototype does not retry)");
  }
}

template <class F>
void in_threads(size_t n, F f) {
  std::vector<std::thread> th;
  for (size_t k = 1; k < n; ++k) th.emplace_back(f, k);
  f(0);
  for (auto& x : th) x.join();
}

void fsync_path(const std::string& path, bool dir) {
  const int fd = ::open(path.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  check(fd >= 0 && ::fsync(fd) == 0, path + ": fsync failed");
  ::close(fd);
}

std::string utc(uint32_t now) {  // as the writer's root attribute `created`
  const std::time_t t = now;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void barrier(const Options& o) {
  if (o.world > 1) MPI_Barrier(MPI_COMM_WORLD);
}

// XXH3 of this process's datasets (its threads' shares of the world * split parts), then every process holds all
// hashes (bitwise or: the others' slots are 0).
std::vector<uint64_t> hash_shares(const Template& t, const std::vector<char>& arena, const Options& o) {
  std::vector<uint64_t> hashes(t.datasets.size(), 0);
  const auto hs = shares(t.datasets.size(), o.world * o.split, [&](size_t i) { return t.datasets[i].size; });
  in_threads(o.split, [&](size_t k) {
    const size_t part = o.rank * o.split + k;
    for (size_t i = hs[part]; i < hs[part + 1]; ++i)
      hashes[i] = h5ddp::ckpt::hash_bytes(arena.data() + t.datasets[i].arena_at, t.datasets[i].size);
  });
  if (o.world > 1)
    MPI_Allreduce(MPI_IN_PLACE, hashes.data(), static_cast<int>(hashes.size()), MPI_UINT64_T, MPI_BOR, MPI_COMM_WORLD);
  return hashes;
}

// The checksums, root step, objects' modification times and `created` patched into the in-memory metadata.
void patch(Template& t, const std::vector<uint64_t>& hashes, int64_t step, size_t bad) {
  for (size_t i = 0; i < t.datasets.size(); ++i) {
    const uint64_t v = hashes[i] ^ (i == bad ? 1 : 0);
    std::memcpy(gap_pointer(t, t.datasets[i].attr_at), &v, 8);
    t.datasets[i].xxh3 = hashes[i];
  }
  if (t.step_at) std::memcpy(gap_pointer(t, t.step_at), &step, 8);
  const uint32_t now = static_cast<uint32_t>(std::time(nullptr));  // what HDF5 writes at creation
  for (uint64_t at : t.mtimes) std::memcpy(gap_pointer(t, at), &now, 4);
  const std::string created = utc(now);
  if (t.created_at && created.size() == t.created.size())  // same length: the string's heap object stays
    std::memcpy(gap_pointer(t, t.created_at), created.data(), created.size());
}

// NAME.partial: created at its full size by the first process, then every process writes its parts (metadata
// pieces and data alike, cut by bytes in file order) and fsyncs it.
void write_partial(const Template& t, const std::vector<Segment>& segs, const Options& o, SaveTimes& s,
                   Clock::time_point t0) {
  const std::string partial = o.out + ".partial";
  if (o.rank == 0) {
    const int fd = ::open(partial.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    check(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(t.file_size)) == 0 && ::close(fd) == 0,
          partial + ": cannot create");
  }
  barrier(o);
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CLOEXEC);
  check(fd >= 0, partial + ": cannot open");
  const auto ws = shares(segs.size(), o.world * o.split, [&](size_t i) { return segs[i].n; });
  in_threads(o.split, [&](size_t k) { write_run(fd, segs, ws[o.rank * o.split + k], ws[o.rank * o.split + k + 1]); });
  s.write = since(t0) - s.hash - s.patch;
  check(!o.fsync || ::fsync(fd) == 0, partial + ": fsync failed");
  check(::close(fd) == 0, partial + ": close failed");
  barrier(o);
  s.fsync = since(t0) - s.hash - s.patch - s.write;
}

// One save through the template (every process): hashes, patches, NAME.partial written and fsynced, then the
// first process renames it to NAME and fsyncs the directory.
SaveTimes save(Template& t, const std::vector<char>& arena, const Options& o, int64_t step, size_t bad) {
  SaveTimes s;
  const auto t0 = Clock::now();
  const std::vector<uint64_t> hashes = hash_shares(t, arena, o);
  s.hash = since(t0);
  patch(t, hashes, step, bad);
  const std::vector<Segment> segs = segments(t, arena);
  s.patch = since(t0) - s.hash;
  write_partial(t, segs, o, s, t0);
  if (o.rank == 0) {
    std::filesystem::rename(o.out + ".partial", o.out);
    if (o.fsync) fsync_path(std::filesystem::absolute(o.out).parent_path().string(), true);
  }
  barrier(o);
  s.total = since(t0);
  s.commit = s.total - s.hash - s.patch - s.write - s.fsync;
  return s;
}

bool float_tensor(const std::string& p) {
  auto ends = [&](const std::string& e) {
    return p.size() > e.size() && p.compare(p.size() - e.size(), e.size(), e) == 0;
  };
  return p.rfind("/model/", 0) == 0 || ends("/exp_avg") || ends("/exp_avg_sq");
}
bool step_counter(const std::string& p) {
  return p == "/train/step" ||
         (p.rfind("/optimizer/state/", 0) == 0 && p.size() > 5 && p.substr(p.size() - 5) == "/step");
}
size_t first_flipped(const Template& t) {
  for (size_t i = 0; i < t.datasets.size(); ++i)
    if (float_tensor(t.datasets[i].path)) return i;
  return 0;
}

// What a training step changes, in the state: one byte of every k-th float tensor (model, Adam moments), and the
// step counters (/train/step, Adam's steps) become `step` (the root attribute is patched to match: rule R1).
void train(const Template& t, std::vector<char>& arena, int k, int rep, int64_t step) {
  int n = 0;
  for (const auto& d : t.datasets) {
    if (float_tensor(d.path) && n++ % k == 0) arena[d.arena_at + static_cast<uint64_t>(rep) % d.size] ^= 0x5A;
    if (step_counter(d.path) && d.size == 8) std::memcpy(arena.data() + d.arena_at, &step, 8);
  }
}

Template build(const Options& o) {
  const auto t0 = Clock::now();
  Template t;
  read_structure(o.file, t);
  const double walk = since(t0);
  read_metadata(o.file, t);
  const double meta = since(t0);
  count_values(t);
  const double search = since(t0);
  locate(o.out + ".probe" + std::to_string(o.rank), t);
  std::printf(
      "INFO template: %zu datasets, file %llu bytes, metadata %llu bytes in %zu gaps, %llu written in %zu pieces; "
      "%zu datasets with object times\n",
      t.datasets.size(), static_cast<unsigned long long>(t.file_size),
      static_cast<unsigned long long>(t.metadata_bytes), t.gaps.size(),
      static_cast<unsigned long long>(t.written_metadata_bytes), t.pieces.size(), g_timed_objects);
  std::printf(
      "RESULT op=template_build method=template seconds=%.3f walk=%.3f read_metadata=%.3f search=%.3f "
      "probe=%.3f datasets=%zu\n",
      since(t0), walk, meta - walk, search - meta, since(t0) - search, t.datasets.size());
  return t;
}

Options parse(int argc, char** argv) {
  Options o;
  check(argc >= 3,
        "usage: h5ddp-bench-template-save FILE OUT [--reps R] [--warmup 0|1] [--flip-every K] "
        "[--fsync 0|1] [--bad-hash 0|1] [--ranks-split N]");
  o.file = argv[1], o.out = argv[2];
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::stoi(argv[i + 1]);
    if (k == "--reps")
      o.reps = v;
    else if (k == "--warmup")
      o.warmup = v;
    else if (k == "--flip-every")
      o.flip_every = std::max(1, v);
    else if (k == "--fsync")
      o.fsync = v != 0;
    else if (k == "--bad-hash")
      o.bad_hash = v != 0;
    else if (k == "--ranks-split")
      o.split = std::max(1, v);
    else
      throw std::runtime_error("unknown option " + k);
  }
  return o;
}

void run(const Options& o) {
  Template t = build(o);
  std::vector<char> arena = read_state(o.file, t);
  int64_t step = t.step;
  for (int rep = 0; rep < o.warmup + o.reps; ++rep) {
    train(t, arena, o.flip_every, rep, ++step);
    if (o.rank == 0) std::filesystem::remove(o.out);  // untimed, as the h5ddp benchmark deletes its file
    barrier(o);
    const SaveTimes s = save(t, arena, o, step, o.bad_hash ? first_flipped(t) : SIZE_MAX);
    if (rep < o.warmup) continue;
    std::printf(
        "RESULT op=save method=template seconds=%.3f hash=%.3f patch=%.3f write=%.3f fsync=%.3f "
        "commit=%.3f split=%d processes=%d datasets=%zu\n",
        s.total, s.hash, s.patch, s.write, s.fsync, s.commit, o.split, o.world, t.datasets.size());
    std::fflush(stdout);
  }
  const Dataset& d = t.datasets[first_flipped(t)];
  std::printf("INFO last save: step %lld, %s xxh3 %llu%s\n", static_cast<long long>(step), d.path.c_str(),
              static_cast<unsigned long long>(d.xxh3), o.bad_hash ? " (patched as xxh3 ^ 1)" : "");
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    Options o = parse(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &o.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &o.world);
    if (o.rank != 0 && !std::freopen("/dev/null", "w", stdout)) throw std::runtime_error("no /dev/null");
    run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "h5ddp-bench-template-save: %s\n", e.what());
    rc = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}

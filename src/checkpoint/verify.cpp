// Full verification of a checkpoint file: structure against docs/FORMAT.md and every checksum, streamed
// through a bounded buffer. Serial (h5ddp-ckpt verify) and collective (verify_checkpoint_collective) flavours.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "checkpoint/errors.hpp"
#include "checkpoint/hash.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/rows.hpp"
#include "checkpoint/rules.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/mpi_comm.hpp"

namespace h5ddp {
namespace ckpt {
namespace {

// Verification reads each dataset through one reused buffer of this size per rank (whatever the checkpoint's
// size) and hashes each piece right after reading it, while it is still in the CPU cache (measurements:
// docs/DESIGN.md, "Verification is streamed").
constexpr size_t kVerifyBufferBytes = 4u << 20;

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof(b), "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

// Verifies one dataset's checksum by streaming it through `buf` (grown as needed; the caller reuses it for
// every dataset of a file: a fresh buffer per dataset costs page faults and zeroing); returns "" or the problem.
std::string verify_dataset(hid_t f, const DatasetPlan& d, const std::string& file, std::vector<char>& buf) {
  return capture_error([&] {
    with_context("verifying " + d.path + " in " + file, [&] {
      h5::SilenceErrors quiet;
      h5::Handle ds = h5::dataset(H5Dopen2(f, d.path.c_str(), H5P_DEFAULT));
      h5::Handle space = h5::dataspace(H5Dget_space(ds));
      if (h5::space_shape(space) != d.shape) throw CheckpointError("shape changed while reading " + d.path);
      h5::Handle type = h5::datatype(H5Dget_type(ds));
      h5::Handle expect = d.file_type();
      if (H5Tequal(type, expect) <= 0)
        throw CheckpointError(file + ": dataset " + d.path + " has an HDF5 type that does not match its dtype");
      const size_t rb = d.row_bytes(), rows = d.rows();
      const size_t rows_per_chunk = std::max<size_t>(1, rb ? kVerifyBufferBytes / rb : 1);
      buf.resize(std::max(buf.size(), std::min(rows, rows_per_chunk) * rb));
      StreamHash st;
      bool bools_ok = true;
      for (size_t r = 0; r < rows && rb > 0; r += rows_per_chunk) {
        const size_t end = std::min(rows, r + rows_per_chunk);
        read_rows(ds, d, r, end, buf.data(), H5P_DEFAULT);
        st.update(buf.data(), (end - r) * rb);
        if (d.dtype == DType::kBool) bools_ok = bools_ok && bool_bytes_ok(buf.data(), (end - r) * rb);
      }
      if (!bools_ok)
        throw CheckpointError(file + ": R22: bool dataset " + d.path + " holds a value other than 0 and 1");
      const uint64_t computed = st.digest();
      if (computed != d.checksum)
        throw CheckpointError(file + ": R13: checksum mismatch in dataset " + d.path + " (stored " + hex(d.checksum) +
                              ", computed " + hex(computed) + ")");
    });
  });
}

// Rule problems (or the one error that stopped the walk) and the datasets to checksum; notes: what a file of a newer
// revision holds that this reader does not know.
std::vector<std::string> check_structure(hid_t f, const std::string& path, std::vector<DatasetPlan>* datasets,
                                         std::vector<std::string>* notes) {
  std::vector<std::string> problems;
  std::string e = capture_error([&] {
    const FileFacts facts = read_facts(f, path);
    problems = rule_problems(facts, notes);
    if (!problems.empty()) return;  // the manifest needs a valid layout
    *datasets = manifest_datasets(f, manifest_of(facts));
  });
  if (!e.empty()) problems.insert(problems.begin(), e);
  return problems;
}

// R1, R8, R10, R11 over the values of the file (read, checksummed); "" or the problems.
std::vector<std::string> check_values(hid_t f, const std::vector<DatasetPlan>& datasets, const std::string& path) {
  std::vector<std::string> problems;
  std::string e = capture_error([&] {
    FileValues v;
    v.root_step = h5::read_attr_int(f, format::kAttrStep);
    auto scalar = [&](const char* p) {
      DatasetPlan d;
      d.path = p;
      d.dtype = DType::kI64;
      int64_t x = 0;
      h5::Handle ds = h5::dataset(H5Dopen2(f, p, H5P_DEFAULT));
      read_rows(ds, d, 0, 1, &x, H5P_DEFAULT);
      return x;
    };
    v.counters.step = scalar(format::kTrainStep);
    v.counters.epoch = scalar(format::kTrainEpoch);
    v.counters.samples_consumed = scalar(format::kTrainSamplesConsumed);
    v.data.epoch = scalar(format::kDataEpoch);
    v.data.position = scalar(format::kDataPosition);
    v.data.global_batch = scalar(format::kDataGlobalBatch);
    const std::string state = std::string(format::kOptimizerStateGroup) + "/";
    for (const auto& d : datasets) {
      const std::string entry =
          d.path.compare(0, state.size(), state) == 0 ? format::optimizer_state_entry(d.path) : "";
      if (entry.size() > 5 && entry.compare(entry.size() - 5, 5, "/step") == 0)
        v.adam_steps.emplace_back(entry.substr(0, entry.size() - 5), scalar(d.path.c_str()));
    }
    problems = value_problems(path, v);
  });
  if (!e.empty()) problems.push_back(e);
  return problems;
}

}  // namespace
}  // namespace ckpt

VerifyReport verify_checkpoint_file(const std::string& path) {
  VerifyReport report;
  std::string e = ckpt::capture_error([&] {
    h5::Handle f = ckpt::open_checkpoint(nullptr, path);
    std::vector<ckpt::DatasetPlan> datasets;
    report.problems = ckpt::check_structure(f, path, &datasets, &report.notes);
    std::vector<char> buf;
    for (const auto& d : datasets) {
      std::string p = ckpt::verify_dataset(f, d, path, buf);
      if (!p.empty()) report.problems.push_back(p);
    }
    if (report.problems.empty()) report.problems = ckpt::check_values(f, datasets, path);
  });
  if (!e.empty()) report.problems.push_back(e);
  report.ok = report.problems.empty();
  return report;
}

std::vector<std::string> verify_checkpoint_collective(MpiComm& comm, const std::string& path) {
  std::vector<std::string> problems;
  h5::Handle f;
  std::string e = ckpt::capture_error([&] { f = ckpt::open_checkpoint(&comm, path); });
  if (!e.empty()) return {e};  // open_checkpoint agrees on its errors: every rank is here
  std::vector<ckpt::DatasetPlan> datasets;
  problems = ckpt::check_structure(f, path, &datasets, nullptr);  // collective metadata: same answer on every rank
  const auto owner = ckpt::assign_whole_datasets(datasets, comm.size());
  std::string mine;
  std::vector<char> buf;
  for (size_t i = 0; i < datasets.size(); ++i) {
    if (owner[i] != comm.rank()) continue;
    std::string p = ckpt::verify_dataset(f, datasets[i], path, buf);
    if (!p.empty()) mine += p + '\0';  // problems may span lines
  }
  for (int r = 0; r < comm.size(); ++r) {
    std::string theirs = comm.broadcast_string(mine, r);
    for (size_t pos = 0; pos < theirs.size();) {
      const size_t nl = theirs.find('\0', pos);
      problems.push_back(theirs.substr(pos, nl - pos));
      pos = nl + 1;
    }
  }
  if (problems.empty()) problems = ckpt::check_values(f, datasets, path);  // small reads, same values everywhere
  f.close();
  return problems;
}

}  // namespace h5ddp

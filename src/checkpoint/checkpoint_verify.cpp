// Full verification of a checkpoint file: structure against docs/FORMAT.md and every checksum, streamed
// through a bounded buffer. Serial (h5ddp-ckpt verify) and collective (find_resume_checkpoint) flavours.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "checkpoint/checkpoint_internal.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"

namespace h5ddp {
namespace ckpt {
namespace {

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof(b), "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

struct VisitState {
  std::vector<std::pair<std::string, H5O_type_t>> objects;
};

herr_t visit_cb(hid_t, const char* name, const H5O_info_t* info, void* data) {
  static_cast<VisitState*>(data)->objects.emplace_back(std::string("/") + name, info->type);
  return 0;
}

bool allowed_group(const std::string& p) {
  static const std::set<std::string> fixed = {"/.",
                                              "/",
                                              format::kModelGroup,
                                              format::kOptimizerGroup,
                                              format::kParamGroupsGroup,
                                              format::kOptimizerStateGroup,
                                              format::kTrainGroup,
                                              format::kSchedulerGroup,
                                              format::kDataGroup,
                                              format::kRngGroup,
                                              format::kMetaGroup,
                                              format::kUserGroup};
  if (fixed.count(p)) return true;
  auto under = [&](const std::string& g) {
    const std::string prefix = g + "/";
    return p.compare(0, prefix.size(), prefix) == 0 && p.find('/', prefix.size()) == std::string::npos;
  };
  return under(format::kParamGroupsGroup) || under(format::kOptimizerStateGroup);
}

}  // namespace

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
      for (size_t r = 0; r < rows && rb > 0; r += rows_per_chunk) {
        const size_t end = std::min(rows, r + rows_per_chunk);
        read_rows(ds, d, r, end, buf.data(), H5P_DEFAULT);
        st.update(buf.data(), (end - r) * rb);
      }
      const uint64_t computed = st.digest();
      if (computed != d.checksum)
        throw CheckpointError(file + ": checksum mismatch in dataset " + d.path + " (stored " + hex(d.checksum) +
                              ", computed " + hex(computed) + ")");
    });
  });
}

std::vector<std::string> unexpected_objects(hid_t f, const std::vector<DatasetPlan>& expected,
                                            const std::string& file) {
  std::set<std::string> datasets;
  for (const auto& d : expected) datasets.insert(d.path);
  VisitState st;
  h5::SilenceErrors quiet;
  H5DDP_CHECK_H5(H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &st, H5O_INFO_BASIC));
  std::vector<std::string> problems;
  for (const auto& [path, type] : st.objects) {
    const bool ok = type == H5O_TYPE_DATASET ? datasets.count(path) > 0 : type == H5O_TYPE_GROUP && allowed_group(path);
    if (!ok) problems.push_back(file + ": unexpected object " + path + " (not in docs/FORMAT.md's layout)");
    if (type == H5O_TYPE_DATASET && ok) {
      h5::Handle ds = h5::dataset(H5Dopen2(f, path.c_str(), H5P_DEFAULT));
      if (!h5::has_attr(ds, format::kAttrChecksum) || !h5::has_attr(ds, format::kAttrDtype))
        problems.push_back(file + ": dataset " + path + " lacks its dtype or xxh3 attribute");
    }
  }
  return problems;
}

// Structure problems (or the one error that stopped the walk) and the datasets to checksum.
std::vector<std::string> check_structure(hid_t f, const std::string& path, std::vector<DatasetPlan>* datasets) {
  std::vector<std::string> problems;
  std::string e = capture_error([&] {
    CheckpointManifest m = read_manifest_from(f, path);
    *datasets = manifest_datasets(f, m);
    problems = unexpected_objects(f, *datasets, path);
  });
  if (!e.empty()) problems.insert(problems.begin(), e);
  return problems;
}

}  // namespace ckpt

VerifyReport verify_checkpoint_file(const std::string& path) {
  VerifyReport report;
  std::string e = ckpt::capture_error([&] {
    h5::Handle f = ckpt::open_checkpoint(nullptr, path);
    std::vector<ckpt::DatasetPlan> datasets;
    report.problems = ckpt::check_structure(f, path, &datasets);
    std::vector<char> buf;
    for (const auto& d : datasets) {
      std::string p = ckpt::verify_dataset(f, d, path, buf);
      if (!p.empty()) report.problems.push_back(p);
    }
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
  problems = ckpt::check_structure(f, path, &datasets);  // collective metadata: same answer on every rank
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
  f.close();
  return problems;
}

}  // namespace h5ddp

// CheckpointFile: serial, read-only access to one checkpoint for tools (info, diff, export).
#include "checkpoint/hash.hpp"
#include "checkpoint/plan.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/rows.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"

namespace h5ddp {

struct CheckpointFile::Impl {
  std::string path;
  h5::Handle file;
  CheckpointManifest manifest;
  std::vector<ckpt::DatasetPlan> datasets;
};

CheckpointFile::CheckpointFile(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->file = ckpt::open_checkpoint(nullptr, path);
  impl_->manifest = ckpt::read_manifest_from(impl_->file, path);
  for (auto& d : ckpt::manifest_datasets(impl_->file, impl_->manifest))
    if (d.string_size == 0) impl_->datasets.push_back(std::move(d));
}

CheckpointFile::~CheckpointFile() = default;

const CheckpointManifest& CheckpointFile::manifest() const {
  return impl_->manifest;
}

std::vector<TensorInfo> CheckpointFile::datasets() const {
  std::vector<TensorInfo> out;
  for (const auto& d : impl_->datasets) out.push_back(TensorInfo{d.path, d.dtype, d.shape, d.checksum});
  return out;
}

std::vector<uint8_t> CheckpointFile::read(const std::string& dataset_path) const {
  for (const auto& d : impl_->datasets) {
    if (d.path != dataset_path) continue;
    return with_context("reading " + d.path + " from " + impl_->path, [&] {
      h5::SilenceErrors quiet;
      h5::Handle ds = h5::dataset(H5Dopen2(impl_->file, d.path.c_str(), H5P_DEFAULT));
      std::vector<uint8_t> buf(d.nbytes());
      if (!buf.empty()) ckpt::read_rows(ds, d, 0, d.rows(), buf.data(), H5P_DEFAULT);
      if (ckpt::hash_bytes(buf.data(), buf.size()) != d.checksum)
        throw CheckpointError(impl_->path + ": R13: checksum mismatch in dataset " + d.path);
      return buf;
    });
  }
  throw CheckpointError(impl_->path + " has no numeric dataset " + dataset_path);
}

SchedulerState CheckpointFile::scheduler() const {
  SchedulerState s;
  h5::Handle g = h5::group(H5Gopen2(impl_->file, format::kSchedulerGroup, H5P_DEFAULT));
  for (const auto& a : h5::attr_names(g)) {
    if (a == format::kAttrSchedulerType)
      s.type = h5::read_attr_string(g, a);
    else
      s.values[a] = h5::read_attr_double(g, a);
  }
  return s;
}

std::map<std::string, std::string> CheckpointFile::meta() const {
  std::map<std::string, std::string> m;
  h5::Handle g = h5::group(H5Gopen2(impl_->file, format::kMetaGroup, H5P_DEFAULT));
  for (const auto& a : h5::attr_names(g)) m[a] = h5::read_attr_string(g, a);
  return m;
}

}  // namespace h5ddp

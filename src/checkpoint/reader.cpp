// Reading checkpoints: open + format checks, the manifest, and load_checkpoint (share + exchange, or
// every rank reads everything).
#include "checkpoint/reader.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>

#include "checkpoint/errors.hpp"
#include "checkpoint/load_source.hpp"
#include "checkpoint/rules.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/mpi_comm.hpp"

namespace h5ddp {

size_t TensorInfo::nbytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

namespace ckpt {
namespace {

std::string check_openable(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return path + ": no such file";
  if (!std::filesystem::is_regular_file(path, ec)) return path + ": not a regular file";
  if (!h5::is_hdf5_file(path)) return path + ": not an HDF5 file (no HDF5 signature)";
  const auto size = std::filesystem::file_size(path, ec);
  const auto end = h5::stored_end_of_file(path);
  if (!ec && end && size < *end)
    return path + ": file truncated: it has " + std::to_string(size) + " bytes, its HDF5 superblock says " +
           std::to_string(*end) + " (a copy or a write that did not finish?)";
  return "";
}

void check_format(hid_t f, const std::string& path) {
  if (!h5::has_attr(f, format::kAttrFormat))
    throw CheckpointError(path + ": an HDF5 file but not an h5ddp checkpoint (no root attribute '" +
                          format::kAttrFormat + "')");
  const std::string name = h5::read_attr_string(f, format::kAttrFormat);
  if (name != format::kFormatName)
    throw CheckpointError(path + ": an HDF5 file but not an h5ddp checkpoint (format is '" + name + "')");
  const int64_t version = h5::read_attr_int(f, format::kAttrFormatVersion);
  if (version != format::kFormatVersion)
    throw CheckpointError(path + ": unsupported checkpoint format version " + std::to_string(version) +
                          " (this h5ddp reads version " + std::to_string(format::kFormatVersion) + ")");
}

DType dataset_dtype(hid_t ds, const std::string& path) {
  const std::string name = h5::read_attr_string(ds, format::kAttrDtype);
  try {
    return dtype_from_name(name);
  } catch (const Error&) {
    throw CheckpointError("dataset " + path + " has unknown dtype '" + name + "'");
  }
}

}  // namespace

std::vector<std::string> read_string_elements(hid_t ds, hid_t type, size_t n) {
  const size_t w = H5Tget_size(type);
  std::vector<char> buf(n * w);
  if (!buf.empty()) H5DDP_CHECK_H5(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()));
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    const char* e = buf.data() + i * w;
    out.emplace_back(e, strnlen(e, w));
  }
  return out;
}

namespace {

TensorInfo tensor_info(hid_t f, const std::string& dataset_path, const std::string& name) {
  return with_context("reading " + dataset_path, [&] {
    h5::Handle ds = h5::dataset(H5Dopen2(f, dataset_path.c_str(), H5P_DEFAULT));
    h5::Handle space = h5::dataspace(H5Dget_space(ds));
    TensorInfo t;
    t.name = name;
    t.dtype = dataset_dtype(ds, dataset_path);
    t.shape = h5::space_shape(space);
    t.checksum = h5::read_attr_uint(ds, format::kAttrChecksum);
    return t;
  });
}

std::vector<std::string> read_strings(hid_t f, const std::string& path, size_t* string_size) {
  h5::Handle ds = h5::dataset(H5Dopen2(f, path.c_str(), H5P_DEFAULT));
  h5::Handle type = h5::datatype(H5Dget_type(ds));
  h5::Handle space = h5::dataspace(H5Dget_space(ds));
  if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) > 0)
    throw CheckpointError("dataset " + path + " is not a fixed-length string dataset");
  const auto shape = h5::space_shape(space);
  if (string_size) *string_size = H5Tget_size(type);
  return read_string_elements(ds, type, shape.empty() ? 1 : static_cast<size_t>(shape[0]));
}

std::vector<std::string> numeric_children(hid_t f, const std::string& group) {
  auto names = h5::children(f, group);
  for (const auto& n : names)
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos)
      throw CheckpointError("unexpected object " + group + "/" + n);
  std::sort(names.begin(), names.end(), [](const auto& a, const auto& b) { return std::stoll(a) < std::stoll(b); });
  return names;
}

}  // namespace

namespace {
std::atomic<int> g_checkpoint_opens{0};

// Collective with a comm: every rank raises the lowest failing rank's error; alone: this rank's.
void raise(MpiComm* comm, const std::string& error) {
  if (comm)
    comm->rethrow_first(checkpoint_error(error));
  else if (!error.empty())
    throw CheckpointError(error);
}
}  // namespace

int checkpoint_opens() {
  return g_checkpoint_opens.load();
}

h5::Handle open_checkpoint(MpiComm* comm, const std::string& path, const MpiioHints& hints) {
  std::string error;
  if (!comm || comm->rank() == 0) error = check_openable(path);
  raise(comm, error);
  h5::Handle f;
  error = capture_error([&] {
    h5::MpioOptions mpio;
    mpio.hints = hints;
    h5::Handle fapl = comm ? h5::mpio_file_access(comm->handle(), mpio) : h5::serial_file_access();
    h5::read_any_format_version(fapl);
    h5::SilenceErrors quiet;
    ++g_checkpoint_opens;
    const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
    if (id < 0) {
      const std::string why = h5::innermost_error_text();
      H5Eclear2(H5E_DEFAULT);
      throw CheckpointError(path + ": cannot be opened as an HDF5 file, damaged or truncated" +
                            (why.empty() ? std::string() : " (HDF5: " + why + ")"));
    }
    f = h5::Handle(id, H5Fclose);
    check_format(f, path);  // collective metadata reads: every rank sees the same answer
  });
  raise(comm, error);
  return f;
}

CheckpointManifest read_valid_manifest(hid_t f, const std::string& path) {
  const FileFacts facts = read_facts(f, path);
  const auto problems = rule_problems(facts, nullptr);
  if (!problems.empty()) throw CheckpointError(joined_problems(problems));
  return manifest_of(facts);
}

CheckpointManifest read_manifest_from(hid_t f, const std::string& path) {
  return with_context("reading the manifest of " + path, [&] {
    h5::SilenceErrors quiet;
    CheckpointManifest m;
    m.path = path;
    m.format_version = static_cast<int>(h5::read_attr_int(f, format::kAttrFormatVersion));
    m.step = h5::read_attr_int(f, format::kAttrStep);
    m.world_size = static_cast<int>(h5::read_attr_int(f, format::kAttrWorldSize));
    m.h5ddp_version = h5::read_attr_string(f, format::kAttrH5ddpVersion);
    m.torch_version = h5::read_attr_string(f, format::kAttrTorchVersion);
    m.created = h5::read_attr_string(f, format::kAttrCreated);
    for (const auto& key : h5::children(f, format::kModelGroup))
      m.model.push_back(tensor_info(f, std::string(format::kModelGroup) + "/" + key, key));
    {
      h5::Handle opt = h5::group(H5Gopen2(f, format::kOptimizerGroup, H5P_DEFAULT));
      m.optimizer_type = h5::read_attr_string(opt, format::kAttrOptimizerType);
    }
    for (const auto& idx : numeric_children(f, format::kParamGroupsGroup)) {
      const std::string gpath = std::string(format::kParamGroupsGroup) + "/" + idx;
      h5::Handle g = h5::group(H5Gopen2(f, gpath.c_str(), H5P_DEFAULT));
      ParamGroup pg;
      for (const auto& a : h5::attr_names(g)) pg.hyper[a] = h5::read_attr_double(g, a);
      const std::string names = gpath + "/" + format::kParamNamesDataset;
      if (h5::exists(f, names)) pg.params = read_strings(f, names, nullptr);
      m.param_groups.push_back(std::move(pg));
    }
    for (const auto& param : h5::children(f, format::kOptimizerStateGroup)) {
      const std::string ppath = std::string(format::kOptimizerStateGroup) + "/" + param;
      for (const auto& key : h5::children(f, ppath))
        if (is_state_key(key))  // others: a newer revision's optional additions (the rules refuse them otherwise)
          m.optimizer_state.push_back(tensor_info(f, ppath + "/" + key, param + "/" + key));
    }
    if (h5::exists(f, format::kUserGroup))
      for (const auto& key : h5::children(f, format::kUserGroup))
        m.user.push_back(tensor_info(f, format::user_dataset(key), key));
    m.rng_cpu_bytes = static_cast<size_t>(tensor_info(f, format::kRngCpu, "cpu").shape.at(1));
    if (h5::exists(f, format::kRngCuda))
      m.rng_cuda_bytes = static_cast<size_t>(tensor_info(f, format::kRngCuda, "cuda").shape.at(1));
    for (const auto& t : m.model) m.tensor_bytes += t.nbytes();
    for (const auto& t : m.optimizer_state) m.tensor_bytes += t.nbytes();
    for (const auto& t : m.user) m.tensor_bytes += t.nbytes();
    return m;
  });
}

std::vector<DatasetPlan> manifest_datasets(hid_t f, const CheckpointManifest& m) {
  std::vector<DatasetPlan> out;
  auto tensor = [&](const std::string& path, const TensorInfo& t) {
    DatasetPlan d;
    d.path = path;
    d.dtype = t.dtype;
    d.shape = t.shape;
    d.checksum = t.checksum;
    out.push_back(std::move(d));
  };
  for (const auto& t : m.model) tensor(format::model_dataset(t.name), t);
  for (const auto& t : m.optimizer_state) tensor(format::optimizer_state_dataset(t.name), t);
  for (const auto& t : m.user) tensor(format::user_dataset(t.name), t);
  for (size_t g = 0; g < m.param_groups.size(); ++g) {
    const std::string path = format::param_group_path(g) + "/" + format::kParamNamesDataset;
    if (!h5::exists(f, path)) continue;
    DatasetPlan d;
    d.path = path;
    d.shape = {static_cast<int64_t>(read_strings(f, path, &d.string_size).size())};
    h5::Handle ds = h5::dataset(H5Dopen2(f, path.c_str(), H5P_DEFAULT));
    d.checksum = h5::read_attr_uint(ds, format::kAttrChecksum);
    out.push_back(std::move(d));
  }
  for (const char* path : small_dataset_paths(m)) {
    if (!h5::exists(f, path)) throw CheckpointError(m.path + ": required dataset " + path + " is missing");
    tensor(path, tensor_info(f, path, path));
  }
  return out;
}

}  // namespace ckpt

CheckpointManifest read_manifest(MpiComm& comm, const std::string& path) {
  return ckpt::read_load_source(comm, path).manifest;
}

CheckpointManifest read_manifest_serial(const std::string& path) {
  h5::Handle f = ckpt::open_checkpoint(nullptr, path);
  return ckpt::read_manifest_from(f, path);
}

}  // namespace h5ddp

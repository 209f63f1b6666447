#include "torch_pickle.hpp"

#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <unordered_map>

#include "h5ddp/error.hpp"
#include "zip_directory.hpp"

namespace h5ddp::interop {
namespace {

torch::ScalarType scalar_type(const std::string& dtype) {
  static const std::map<std::string, torch::ScalarType> kTypes = {
      {"float32", torch::kFloat32},   {"float64", torch::kFloat64}, {"float16", torch::kFloat16},
      {"bfloat16", torch::kBFloat16}, {"int64", torch::kInt64},     {"int32", torch::kInt32},
      {"int16", torch::kInt16},       {"int8", torch::kInt8},       {"uint8", torch::kUInt8},
      {"bool", torch::kBool}};
  return kTypes.at(dtype);  // pickle.cpp makes only these
}

// The archive's directory, read through `in`, and the folder that PyTorchStreamReader looks records up in
// (the first record's).
struct Archive {
  ZipDirectory dir;
  std::string folder;  // "archive/"

  const ZipEntry* find(const std::string& record) const { return dir.find(folder + record); }
};

Archive read_archive(const std::string& path, std::ifstream& in) {
  in.clear();
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  auto read_at = [&](uint64_t offset, char* buffer, size_t n) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(buffer, static_cast<std::streamsize>(n));
    if (static_cast<size_t>(in.gcount()) != n)
      throw CheckpointError(path + ": cannot read " + std::to_string(n) + " bytes at offset " + std::to_string(offset));
  };
  Archive a{ZipDirectory::read(path, file_size, read_at), ""};
  if (a.dir.entries().empty()) throw CheckpointError(path + ": empty zip archive (not a torch.save file)");
  const std::string& first = a.dir.entries()[0].name;
  const auto slash = first.find('/');
  if (slash == std::string::npos)
    throw CheckpointError(path + ": zip archive whose first record '" + printable(first) +
                          "' is not in a folder (not a torch.save file)");
  a.folder = first.substr(0, slash + 1);
  return a;
}

TorchSaveFile read_contents(const std::string& path, const Archive& archive, const PickleLimits& limits) {
  const ZipEntry* pkl_entry = archive.find("data.pkl");
  if (!pkl_entry) throw CheckpointError(path + ": zip archive without data.pkl (not a torch.save file)");
  if (pkl_entry->size > limits.max_pickle_bytes)  // before miniz allocates it
    throw CheckpointError(path + ": data.pkl is " + std::to_string(pkl_entry->size) + " bytes, more than " +
                          std::to_string(limits.max_pickle_bytes) + " (h5ddp-ckpt import's limit)");

  caffe2::serialize::PyTorchStreamReader zip(path);
  TorchSaveFile out;
  {
    auto [pkl, size] = zip.getRecord("data.pkl");
    out.pickle = unpickle(path, static_cast<const char*>(pkl.get()), size, limits);
  }
  // Every storage's record must hold its bytes before any is read: sizes come from the directory, so a
  // storage declaring more than the file holds allocates nothing.
  check_storage_records(path, out.pickle, [&](const std::string& record) -> std::optional<uint64_t> {
    const ZipEntry* e = archive.find(record);
    return e ? std::optional<uint64_t>(e->size) : std::nullopt;
  });
  std::unordered_map<const PyValue*, torch::Tensor> storages;
  for (const PyValue* v : out.pickle.storages()) {
    const PickledStorage& st = *v->storage;
    const std::string record = "data/" + st.key;
    auto [ptr, size] = zip.getRecord(record);
    const size_t want = static_cast<size_t>(st.numel) * st.element_size;
    if (size < want)  // miniz's size of the record, in case it differs from the directory's
      throw CheckpointError(path + ": record " + record + " holds " + std::to_string(size) +
                            " bytes, its storage needs " + std::to_string(want));
    torch::Tensor t = torch::empty({st.numel}, torch::TensorOptions().dtype(scalar_type(st.dtype)));
    if (want) std::memcpy(t.data_ptr(), ptr.get(), want);
    storages.emplace(v, std::move(t));
  }
  for (const PyValue* v : out.pickle.tensors()) {
    const PickledTensor& ti = *v->tensor;
    const torch::Tensor& storage = storages.at(ti.storage);
    // pickle.cpp checked that the view lies inside the storage.
    out.tensors.push_back(ti.numel == 0
                              ? torch::empty(ti.size, storage.options())
                              : storage.as_strided(ti.size, ti.stride, ti.offset).clone(at::MemoryFormat::Contiguous));
  }
  return out;
}

std::string one_line(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

}  // namespace

TorchSaveFile read_torch_save(const std::string& path, const PickleLimits& limits) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": cannot open the file");
  char magic[4] = {};
  in.read(magic, 4);
  if (std::memcmp(magic, "PK\x03\x04", 4) != 0) {
    // The legacy format starts with a pickled magic number (protocol 2: 0x80 0x02 0x8a 0x0a).
    const bool legacy = static_cast<uint8_t>(magic[0]) == 0x80 && static_cast<uint8_t>(magic[2]) == 0x8a;
    throw CheckpointError(path + (legacy ? ": written by torch.save in PyTorch's legacy (pre-1.6) format; re-save it "
                                           "with torch.save(obj, path) in PyTorch >= 1.6 (the zip format)"
                                         : ": not a torch.save file (no zip archive)"));
  }
  try {
    const Archive archive = read_archive(path, in);
    in.close();
    return read_contents(path, archive, limits);
  } catch (const CheckpointError&) {
    throw;
  } catch (const c10::Error& e) {
    throw CheckpointError(path + ": cannot read the torch.save archive: " + one_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": cannot read the torch.save archive: " + one_line(e.what()));
  }
}

}  // namespace h5ddp::interop

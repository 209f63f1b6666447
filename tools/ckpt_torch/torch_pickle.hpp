// Reading files written by Python's torch.save (the zip format of PyTorch >= 1.6) without Python.
//
// Why not torch::pickle_load: LibTorch 1.13's unpickler turns every collections.OrderedDict into None
// (it expects OrderedDicts only as a tensor's empty backward hooks), so the most common file of all,
// torch.save(model.state_dict(), path), fails with an internal assert. This reader understands the part
// of the pickle protocol that state dicts and checkpoints use (dicts, OrderedDicts, lists, tuples,
// numbers, strings, tensors, parameters) and refuses anything else with a message naming the file and
// the Python object it met. Tensors come from the zip's data/<key> records through LibTorch's own
// PyTorchStreamReader.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace h5ddp::interop {

struct PyValue;
using PyPtr = std::shared_ptr<PyValue>;

// One unpickled Python value. Containers are shared (the pickle memo refers to them more than once).
struct PyValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kStr, kTuple, kList, kDict, kTensor, kGlobal, kStorage };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                              // kStr; kGlobal: "module.name"
  std::vector<PyPtr> items;                   // kTuple, kList
  std::vector<std::pair<PyPtr, PyPtr>> dict;  // kDict, insertion order
  torch::Tensor tensor;                       // kTensor; kStorage: the storage as a 1-d tensor

  // Value of the string key `key` in a dict, or nullptr.
  PyPtr get(const std::string& key) const;
  // "dict", "tensor", "int", ... (for messages).
  std::string type_name() const;
};

// Local. Reads `path` as written by torch.save. Tensors are returned contiguous, on the CPU, owning their
// memory. Throws CheckpointError naming the file for a file that is not a zip archive (including the
// legacy pre-1.6 format), a damaged archive, or a pickled object outside the supported subset.
PyPtr read_torch_save(const std::string& path);

}  // namespace h5ddp::interop

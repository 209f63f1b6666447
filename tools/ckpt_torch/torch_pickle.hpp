// Reading files written by Python's torch.save (the zip format of PyTorch >= 1.6) without Python.
//
// Why not torch::pickle_load: LibTorch 1.13's unpickler turns every collections.OrderedDict into None
// (it expects OrderedDicts only as a tensor's empty backward hooks), so the most common file of all,
// torch.save(model.state_dict(), path), fails with an internal assert. pickle.hpp understands the part
// of the pickle protocol that state dicts and checkpoints use (dicts, OrderedDicts, lists, tuples,
// numbers, strings, tensors, parameters), bounds everything a hostile file could inflate, and refuses
// anything else with a message naming the file and the Python object it met. zip_directory.hpp checks
// the archive's declared sizes; the bytes come through LibTorch's own PyTorchStreamReader.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "pickle.hpp"

namespace h5ddp::interop {

// A torch.save file in memory: its pickled object and every tensor in it (contiguous, on the CPU,
// owning their memory).
struct TorchSaveFile {
  Pickle pickle;
  std::vector<torch::Tensor> tensors;  // by PickledTensor::index

  const torch::Tensor& tensor(const PyValue& v) const { return tensors.at(v.tensor->index); }
};

// Local. Reads `path` as written by torch.save. Throws CheckpointError naming the file for a file that is
// not a zip archive (including the legacy pre-1.6 format), a damaged or truncated archive, a pickled
// object outside the supported subset, or a file beyond PickleLimits.
TorchSaveFile read_torch_save(const std::string& path, const PickleLimits& limits = {});

}  // namespace h5ddp::interop

// Everything that crosses a restart, as one plain struct with no LibTorch or HDF5 types: what is not
// in TrainState is not restored. Tensors appear as TensorRef views (name, dtype, shape, host bytes)
// pointing into memory the caller owns: the model's parameters on save, the destination on load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "h5ddp/comm.hpp"

namespace h5ddp {

struct TensorRef {
  std::string name;  // state-dict key, e.g. "conv1.weight" (never a "module." prefix)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty = scalar
  void* data = nullptr;        // host memory, C order, numel() * dtype_size(dtype) bytes; not owned

  size_t numel() const {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  }
  size_t nbytes() const { return numel() * dtype_size(dtype); }

  // Element-range sharding (ZeRO-2/3, docs/SHARDING.md): `data` holds only rows [row_begin, row_end) of
  // dimension 0 of the tensor of `shape` (which stays the whole tensor's); row_end < 0: all of it. A save
  // writes each rank's rows into the one dataset (the ranks' pieces must tile it); a load reads just them.
  int64_t row_begin = 0;
  int64_t row_end = -1;
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  // Whether `data` holds part of the tensor only (a range that is not all rows).
  bool piece() const { return row_end >= 0 && !(row_begin == 0 && row_end == rows()); }
  size_t held_numel() const {
    if (!piece()) return numel();
    const int64_t r = rows();
    return r == 0 ? 0 : numel() / static_cast<size_t>(r) * static_cast<size_t>(row_end - row_begin);
  }
  size_t held_nbytes() const { return held_numel() * dtype_size(dtype); }
};

// One optimizer param group: hyperparameters by PyTorch's names (lr, betas0, betas1, eps,
// weight_decay, momentum, ...) and the names of its parameters, in order.
struct ParamGroup {
  std::map<std::string, double> hyper;
  std::vector<std::string> params;
};

struct OptimizerState {
  std::string type;  // "adam", "adamw", "sgd"
  // false: every rank holds the whole state (replicated). true (ZeRO-1, DdpOptions::shard_optimizer): `state`
  // and each group's `params` list only this rank's parameters; save merges the ranks' lists into the full
  // logical state (the same file as a replicated run: each rank writes the datasets it owns), and load fills
  // exactly the entries this rank lists (every entry of the file must be listed by exactly one rank).
  bool sharded = false;
  std::vector<ParamGroup> groups;
  // Per-parameter state; name is "<param name>/<state key>", e.g. "fc1.weight/exp_avg", "fc1.weight/step".
  std::vector<TensorRef> state;
};

struct SchedulerState {
  std::string type;                      // "constant", "step", "cosine", ...
  std::map<std::string, double> values;  // e.g. base_lr, last_epoch, gamma, step_size
};

// Counters are global: independent of the world size.
struct Counters {
  int64_t step = 0;              // optimizer steps taken
  int64_t epoch = 0;             // current epoch (0-based)
  int64_t samples_consumed = 0;  // total samples consumed over all epochs and ranks
};

struct DataState {
  uint64_t seed = 0;  // sampler seed: shuffle of epoch e is a function of (seed, e)
  int64_t epoch = 0;
  int64_t position = 0;      // global samples consumed in this epoch: the next sample is perm[position]
  int64_t global_batch = 0;  // samples per optimizer step over all ranks
};

// One rank's random generator states, as opaque bytes from the generator.
struct RngState {
  std::vector<uint8_t> cpu;
  std::vector<uint8_t> cuda;
};

struct TrainState {
  Counters counters;
  DataState data;
  SchedulerState scheduler;
  std::vector<TensorRef> model;
  OptimizerState optimizer;
  std::vector<TensorRef> user;              // the caller's own named tensors and scalars, stored as /user/<name>
  RngState rng;                             // this rank's generators (save: written to row `rank`)
  std::vector<RngState> rng_by_rank;        // load: every row in the file (world size at save)
  int saved_world_size = 0;                 // load: world size at save
  std::map<std::string, std::string> meta;  // free-form strings stored as root attributes (model name, ...)
};

}  // namespace h5ddp

// A small, deterministic TrainState for checkpoint tests: every dtype h5ddp stores, a scalar, an empty tensor, two
// param groups, Adam-like state, and per-rank RNG rows. Owns the bytes its refs point to. (tests/support)
#pragma once

#include <cstdint>
#include <cstring>
#include <list>
#include <string>
#include <vector>

#include "h5ddp/train_state.hpp"

namespace h5ddp::test {

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

inline std::vector<TensorSpec> model_specs() {
  return {{"conv1.weight", DType::kF32, {4, 1, 3, 3}},
          {"conv1.bias", DType::kF32, {4}},
          {"fc.weight", DType::kF64, {3, 5}},
          {"bn.num_batches_tracked", DType::kI64, {}},
          {"emb.weight", DType::kF16, {7, 2}},
          {"lm.weight", DType::kBF16, {5, 3}},
          {"mask", DType::kBool, {6}},
          {"empty", DType::kF32, {0, 3}},
          {"big.weight", DType::kF32, {1000, 300}},
          {"ids", DType::kI32, {9}}};
}

inline std::vector<TensorSpec> optimizer_specs() {
  // Adam's state as docs/FORMAT.md defines it: exp_avg, exp_avg_sq (the parameter's dtype and shape), an int64 step.
  return {{"conv1.weight/exp_avg", DType::kF32, {4, 1, 3, 3}},
          {"conv1.weight/exp_avg_sq", DType::kF32, {4, 1, 3, 3}},
          {"conv1.weight/step", DType::kI64, {}},
          {"big.weight/exp_avg", DType::kF32, {1000, 300}},
          {"big.weight/exp_avg_sq", DType::kF32, {1000, 300}},
          {"big.weight/step", DType::kI64, {}}};
}

// Deterministic bytes of a tensor: a function of (name, seed) only, so every rank builds the same replica.
inline void fill_bytes(std::vector<uint8_t>& buf, const std::string& name, uint64_t seed, DType dtype) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (char c : name) x = (x ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  for (auto& b : buf) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(x >> 56);
  }
  if (dtype == DType::kBool)
    for (auto& b : buf) b &= 1;
}

class OwnedState {
 public:
  // filled = false: zeroed destinations with the same names/dtypes/shapes (a load target).
  OwnedState(uint64_t seed, int rank, bool filled = true, std::vector<TensorSpec> model = model_specs(),
             std::vector<TensorSpec> opt = optimizer_specs()) {
    for (const auto& s : model) state.model.push_back(make(s, seed, filled));
    for (const auto& s : opt) state.optimizer.state.push_back(make(s, seed, filled));
    if (!filled) return;
    state.counters = {200 + static_cast<int64_t>(seed), 3, 12800};
    state.data = {42 + seed, 3, 640, 64};
    state.scheduler.type = "step";
    state.scheduler.values = {{"base_lr", 1e-3}, {"gamma", 0.5}, {"step_size", 10}, {"last_epoch", 3}};
    state.optimizer.type = "adam";
    ParamGroup g0, g1;
    g0.hyper = {{"lr", 1e-3}, {"betas0", 0.9}, {"betas1", 0.999}, {"eps", 1e-8}, {"weight_decay", 0}, {"amsgrad", 0}};
    g0.params = {"conv1.weight", "conv1.bias", "fc.weight"};
    g1.hyper = {{"lr", 1e-2},  {"betas0", 0.9},        {"betas1", 0.999},
                {"eps", 1e-8}, {"weight_decay", 0.01}, {"amsgrad", 0}};
    g1.params = {"big.weight"};
    state.optimizer.groups = {g0, g1};
    state.rng = rng_of(rank);
    state.meta = {{"model", "fixture"}, {"torch_version", "1.13.1"}};
  }
  OwnedState(const OwnedState&) = delete;
  OwnedState& operator=(const OwnedState&) = delete;

  static RngState rng_of(int rank) {
    RngState r;
    for (int i = 0; i < 24; ++i) r.cpu.push_back(static_cast<uint8_t>(rank * 31 + i));
    return r;
  }

  TensorRef* find(const std::string& name) {
    for (auto& t : state.model)
      if (t.name == name) return &t;
    for (auto& t : state.optimizer.state)
      if (t.name == name) return &t;
    return nullptr;
  }

  TrainState state;

 private:
  TensorRef make(const TensorSpec& s, uint64_t seed, bool filled) {
    TensorRef t;
    t.name = s.name;
    t.dtype = s.dtype;
    t.shape = s.shape;
    auto& buf = storage_.emplace_back(t.nbytes() + 1, 0);  // +1: a valid pointer even when empty
    buf.resize(t.nbytes());
    if (filled) fill_bytes(buf, s.name, seed, s.dtype);
    const std::string step = "/step";  // an Adam step count: 0 <= step <= the counters' step (R8)
    if (filled && s.name.size() > step.size() && s.name.compare(s.name.size() - step.size(), step.size(), step) == 0) {
      const int64_t v = 1;  // nonzero: a load that left it at 0 shows; <= every step the tests save at
      std::memcpy(buf.data(), &v, sizeof(v));
    }
    t.data = buf.data();
    return t;
  }
  std::list<std::vector<uint8_t>> storage_;
};

// Names of tensors whose bytes differ between a and b (both must have the same names in the same order).
inline std::vector<std::string> differing_tensors(const TrainState& a, const TrainState& b) {
  std::vector<std::string> out;
  auto cmp = [&](const std::vector<TensorRef>& x, const std::vector<TensorRef>& y) {
    if (x.size() != y.size()) {
      out.push_back("<count>");
      return;
    }
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].name != y[i].name || x[i].nbytes() != y[i].nbytes() ||
          (x[i].nbytes() && std::memcmp(x[i].data, y[i].data, x[i].nbytes()) != 0))
        out.push_back(x[i].name);
  };
  cmp(a.model, b.model);
  cmp(a.optimizer.state, b.optimizer.state);
  return out;
}

}  // namespace h5ddp::test

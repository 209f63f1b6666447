// The built-in models (docs/MODELS.md defines them exactly, so they can be rebuilt in PyTorch).
// Submodule names give PyTorch-style state-dict keys: "conv1.weight", "fc1.bias", ...
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "h5ddp/fsdp.hpp"
#include "h5ddp/script_module.hpp"
#include "train/config.hpp"

namespace h5ddp {

// Runs one unit of a model's forward (`forward`, the unit named `unit`): FullyShardedDataParallel::run_unit
// under shard stage 3, which gathers the unit's parameters around it. Models call it around each layer.
using UnitRunner = std::function<torch::Tensor(const std::string& unit, const std::function<torch::Tensor()>& forward)>;

// Base of the built-in models: images [B, 1, 28, 28] (or [B, 784]) -> logits [B, 10].
class Model : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  // One line: name, layer sizes, parameter count.
  virtual std::string describe() const = 0;
  // Shard stage 3: each layer's forward then runs through `run` (named as its submodule).
  void set_unit_runner(UnitRunner run) { run_ = std::move(run); }

 protected:
  torch::Tensor unit(const std::string& name, const std::function<torch::Tensor()>& forward) {
    return run_ ? run_(name, forward) : forward();
  }

 private:
  UnitRunner run_;
};

// conv1 1->32 3x3, relu, maxpool 2, conv2 32->64 3x3, relu, maxpool 2, dropout, flatten (1600),
// fc1 1600->128, relu, dropout, fc2 128->10.
class CnnModel final : public Model {
 public:
  explicit CnnModel(double dropout);
  torch::Tensor forward(torch::Tensor x) override;
  std::string describe() const override;

 private:
  double dropout_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

// flatten (784), then for each hidden width h_i: fc{i+1} -> relu -> dropout; last fc -> 10.
class MlpModel final : public Model {
 public:
  MlpModel(std::vector<int64_t> hidden, double dropout);
  torch::Tensor forward(torch::Tensor x) override;
  std::string describe() const override;

 private:
  double dropout_;
  std::vector<int64_t> hidden_;
  std::vector<torch::nn::Linear> layers_;
};

// Local. Builds the model named in `spec` ("cnn" | "mlp"), initialised from the current default
// generator (seed it first); throws ConfigError on an unknown name.
std::shared_ptr<Model> make_model(const ModelSpec& spec);

// What h5ddp-train trains: a built-in Model (spec.name) or a TorchScript module (spec.file, see
// h5ddp/script_module.hpp) as the nn::Module that DDP and the Checkpointer see, its forward, and what a
// checkpoint records about it.
struct TrainModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::string description;  // one line
  // --shard parameters: the units of `module` (a script's: by size, --shard-unit-params, and by what its forward
  // calls; a built-in model's: its layers), then attach_units makes `forward` run them through the wrapper.
  std::function<FsdpOptions(int64_t max_unit_params)> units;
  std::function<void(FullyShardedDataParallel&)> attach_units;
  // /meta strings: "model" (cnn | mlp | torchscript) and its settings; for a script also model_class,
  // model_hash (its code) and model_file.
  std::vector<std::pair<std::string, std::string>> meta;
};

// Local. Builds the built-in model (initialised from the current default generator: seed it first) or loads
// the script (its saved weights). Throws ConfigError on an unknown name or a file that is not TorchScript.
TrainModel build_train_model(const ModelSpec& spec);

// Empty when the checkpoint's meta (`saved`) names the same model as `model`; otherwise why not, listing the
// kind, class and code hash of both. Files without these keys (older, or from a library user) pass.
std::string model_identity_difference(const std::map<std::string, std::string>& saved, const TrainModel& model);

// Number of parameter elements.
int64_t parameter_count(const torch::nn::Module& m);

}  // namespace h5ddp

// The built-in models (docs/MODELS.md defines them exactly, so they can be rebuilt in PyTorch).
// Submodule names give PyTorch-style state-dict keys: "conv1.weight", "fc1.bias", ...
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "train/config.hpp"

namespace h5ddp {

// Base of the built-in models: images [B, 1, 28, 28] (or [B, 784]) -> logits [B, 10].
class Model : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  // One line: name, layer sizes, parameter count.
  virtual std::string describe() const = 0;
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

// Number of parameter elements.
int64_t parameter_count(const torch::nn::Module& m);

}  // namespace h5ddp

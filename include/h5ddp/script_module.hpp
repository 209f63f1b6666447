// A TorchScript module saved from Python (torch.jit.script(m).save(path) or torch.jit.trace) as a
// torch::nn::Module, so that DistributedDataParallel, Checkpointer and the optimizers see its parameters and
// buffers by the names of the Python module's state_dict() ("layer1.0.conv1.weight", "bn.running_mean", ...).
//
//   auto model = h5ddp::ScriptModule::load("model.pt");
//   h5ddp::DistributedDataParallel ddp(comm, *model);
//   torch::optim::Adam opt(model->parameters(), 1e-3);
//   auto logits = model->forward(x);
//
// The tensors are shared, not copied: the nn::Module tree mirrors the script's submodule hierarchy and holds
// the script's own parameter and buffer tensors, so an optimizer step, a checkpoint load or a DDP broadcast
// (all in place) is what the script computes with. Forward runs the TorchScript interpreter with the graph
// executor's optimisations off: the first steps after a resume compute exactly like the later ones (the
// profiling executor would otherwise switch plans after a warm-up, so an interrupted run and an uninterrupted
// one would differ in the steps after the restart).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace h5ddp {

// Runs one unit of a model's forward (`forward`, the unit named `unit`): DistributedDataParallel::run_unit
// under shard stage 3, which gathers the unit's parameters around it. Models call it around each layer.
using UnitRunner = std::function<torch::Tensor(const std::string& unit, const std::function<torch::Tensor()>& forward)>;

class ScriptModule : public torch::nn::Module {
 public:
  // Local. Loads `path` onto the CPU. Throws ConfigError naming the file when it is not a TorchScript
  // archive, has no forward method, or its forward does not take exactly one tensor.
  static std::shared_ptr<ScriptModule> load(const std::string& path);
  ~ScriptModule() override;

  // The script's forward on one tensor; throws h5ddp::Error naming the file and the input's shape when the
  // script rejects it or returns something other than a tensor.
  torch::Tensor forward(const torch::Tensor& x);
  // Shard stage 3: forward then runs the script's top-level children one at a time, each through `run` (named as
  // in the state dict: "0", "1", ... for an nn.Sequential). Throws ConfigError naming the file unless the script's
  // forward is such a chain (sequential_problem()).
  void set_unit_runner(UnitRunner run);
  // Empty when forward only calls top-level children, each on the previous one's output, and returns the last
  // output (a scripted or traced nn.Sequential); otherwise what else it does.
  std::string sequential_problem() const;

  // Sets the training flag of the mirror and of every submodule of the script (BatchNorm, Dropout read it).
  void train(bool on = true) override;

  const std::string& path() const;
  // The script's qualified class name, e.g. "__torch__.ResNet".
  const std::string& class_name() const;
  // 16 hex digits: a hash of the archive's code records (the model's architecture, not its weights), so two
  // saves of one class agree and another class or a changed forward differs.
  const std::string& code_hash() const;

 private:
  struct Impl;
  explicit ScriptModule(std::unique_ptr<Impl> impl);
  void mirror();
  std::unique_ptr<Impl> impl_;
};

}  // namespace h5ddp

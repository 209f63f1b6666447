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
//
// Units (shard stage 3): set_unit_calls copies the forward graph, inlines into the copy every module method call
// that is not a unit's (recursively, through `if` and loop bodies), and wraps each unit call between two custom
// operators, h5ddp_units::enter on the call's first tensor argument and h5ddp_units::exit on its output. Both
// return their input tensor itself (the autograd-tracked one, so the exit callback can register a hook on the
// real output) after calling back into this module's UnitCalls through a process-wide registry. They are marked
// as having side effects, so the interpreter neither drops nor reorders them.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace h5ddp {

// What ScriptModule::forward reports to a sharding wrapper (FullyShardedDataParallel) when units are set.
struct UnitCalls {
  std::function<void()> begin_forward;                           // before the script's forward runs
  std::function<void(size_t unit)> enter;                        // just before each call of unit `unit`
  std::function<void(size_t unit, const at::Tensor& out)> exit;  // just after it, with the call's output
  std::function<void(const at::Tensor& out)> end_forward;        // after forward; `out` undefined if it threw
};

// Which candidate modules a script's forward calls as units (ScriptModule::plan_units).
// A unit is a submodule (at any depth, named as in the state dict: "h.0", "transformer.blocks.3") that forward
// calls, directly or from inside a method of another module, with at least one tensor argument, getting one
// tensor back; it may be called several times, inside `if` and loops. Its parameters are read only inside its
// calls; anything else forward reads (parameters of modules that are not units, a unit's parameter read
// directly as in GPT-2's `F.linear(x, self.wte.weight)`) is `outside` and must stay gathered all forward.
struct UnitPlan {
  std::vector<std::string> units;    // the candidates that are units, in the order the forward first calls them
  std::vector<std::string> outside;  // parameter names (state-dict keys, every name of a tied tensor) that the
                                     // forward reads outside any unit's call
  std::vector<std::string> dropped;  // "name: why" for candidates that cannot be units (never called by forward,
                                     // call takes no tensor, returns a non-tensor, ...)
};

class ScriptModule : public torch::nn::Module {
 public:
  // Local. Loads `path` onto the CPU. Throws ConfigError naming the file when it is not a TorchScript
  // archive, has no forward method, or its forward does not take exactly one tensor.
  static std::shared_ptr<ScriptModule> load(const std::string& path);
  ~ScriptModule() override;

  // The script's forward on one tensor; throws h5ddp::Error naming the file and the input's shape when the
  // script rejects it or returns something other than a tensor.
  torch::Tensor forward(const torch::Tensor& x);
  // Local, pure analysis of forward's graph: which of `candidates` (module names at any depth) are units, which
  // parameters forward reads outside them, and why the others cannot be units. Throws ConfigError naming the
  // file when a candidate is not a submodule or two candidates nest ("h" and "h.0").
  UnitPlan plan_units(const std::vector<std::string>& candidates) const;
  // Local. From now on forward calls `calls` around each call of plan.units (indices into plan.units), in
  // begin_forward ... end_forward. It runs a rewritten copy of the forward graph: the script's own method graphs,
  // shared by every instance of their class, stay as they are. An empty plan.units restores the plain forward.
  // Throws ConfigError naming the file when plan.units is not a valid set of units (see plan_units).
  void set_unit_calls(const UnitPlan& plan, UnitCalls calls);

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

// FullyShardedDataParallel: ZeRO-3 (PyTorch's FSDP, DeepSpeed's stage 3). Each rank keeps only its rows of every
// parameter (its pieces, as ShardedDataParallel's stage 2 owns them), and its range of the averaged gradients
// and of the optimizer state. A parameter's own storage is empty except while a unit that holds it runs:
//
//   units   submodules (names at any depth: "blocks.3", "fc1") that the model's forward runs one at a time. A
//           parameter belongs to the unit whose name prefixes all of its state-dict names.
//   root    every other parameter: outside all units, tied between two units (one tensor under names in both),
//           or read by the forward outside its unit's call (FsdpOptions::root_parameters). The root is gathered
//           for the whole forward and backward.
//
// enter_unit gathers a unit (allgatherv of every rank's rows into the parameters' storage), exit_unit frees it
// again and, when the unit's output needs a gradient, hooks it so that autograd gathers the unit again just
// before it runs the unit's backward; the unit is freed once all of its gradients are accumulated (each
// reduce-scattered as it becomes ready). A C++ model calls run_unit around each unit in its forward (LibTorch has
// no forward hooks); a TorchScript model calls enter/exit from its rewritten graph (ScriptModule::set_unit_calls).
//
//   h5ddp::FsdpOptions o;  o.units = {"fc1", "fc2"};
//   h5ddp::FullyShardedDataParallel fsdp(comm, *model, o);
//   h5ddp::ShardedOptimizer opt(fsdp, make_adam);
//   ... fsdp.prepare_forward(); auto y = fsdp.run_forward([&] { return model->forward(x); });
//       loss(y).backward(); fsdp.finish_backward(); opt.step(); opt.zero_grad(); ...
//
// Every rank must run the same units in the same order (each gather is a collective).
//
// Prefetch (FsdpOptions::prefetch, on by default): the first forward records the order in which units are entered.
// In later forwards, once unit k is gathered, the gather of the unit that followed it in that order starts
// asynchronously (Comm::allgatherv_async into that unit's parameters' storage) and runs while unit k computes;
// entering that unit waits for it instead of gathering. A forward that enters a unit other than the predicted one
// stops predicting for the rest of that forward (a prefetched unit not entered is waited for and freed). In the
// backward, end_forward starts the gather of the last unit entered and each unit's regather starts that of the
// unit entered before it in this forward. Predictions depend only on the order of enter_unit calls, which every
// rank shares, so every rank starts the same gathers in the same order. Memory: at most the root and two units
// are gathered at once (the running one and the prefetched one), i.e. up to the root's bytes plus the two largest
// units' bytes, against the root plus one unit without prefetch (in the backward this relies on autograd finishing
// a unit's gradients before it reaches the output of the unit before it, as its ordering does; a unit with a
// parameter this rank did not use stays until finish_backward, as without prefetch). finish_backward and a
// forward that throws leave no gather in flight.
#pragma once

#include <functional>

#include "h5ddp/sharded_ddp.hpp"

namespace h5ddp {

struct FsdpOptions {
  DdpOptions ddp;  // bucket sizes do not apply: every parameter is its own bucket, reduced as soon as it is ready
  // Unit module names (none may contain another). Empty: the module's top-level children that hold parameters.
  std::vector<std::string> units;
  // Parameter names the forward reads outside their unit's call (they join the root).
  std::vector<std::string> root_parameters;
  // Start the gather of the unit predicted to run next while the current one computes (see above).
  bool prefetch = true;
};

// Local. The units a size policy picks, top-down: a submodule becomes a unit when its parameters (in it and below,
// each tensor once) number at most `max_params` elements, or when no child of it holds parameters (a layer is not
// split further); otherwise its children are considered in turn and its own direct parameters join the root. The
// module itself is never a unit. Names as in the state dict ("h.0", "transformer.blocks.3"), in registration
// order; modules without parameters are skipped. max_params <= 0: a quarter of the model's parameters.
std::vector<std::string> units_by_size(const torch::nn::Module& module, int64_t max_params);

class FullyShardedDataParallel final : public ShardedDataParallel {
 public:
  // Collective: as DistributedDataParallel's constructor, then every rank keeps its rows of each parameter and
  // frees the rest. Refused on every rank (ConfigError naming the parameter) for a parameter that is a view of,
  // or shares storage with, another tensor, or a unit name that is not a submodule or contains another unit.
  FullyShardedDataParallel(Comm& comm, torch::nn::Module& module, FsdpOptions options = {});

  // Collective (every rank runs the same units in the same order). Gathers the unit, runs `forward`, frees the
  // unit; its output hooked for the backward. ConfigError for a name that is not a unit.
  torch::Tensor run_unit(const std::string& unit, const std::function<torch::Tensor()>& forward);
  // Collective: begin_forward, `forward`, end_forward (also when it throws: every unit is then freed). A forward that
  // reads a unit's weights outside run_unit (LibTorch refuses their empty storage) gets a ConfigError naming the units
  // it did not run.
  torch::Tensor run_forward(const std::function<torch::Tensor()>& forward);

  // The steps run_unit and run_forward are made of, for a caller that cannot pass a closure (a rewritten graph).
  void begin_forward();                                   // collective: the root gathered
  void enter_unit(size_t unit);                           // collective: the unit gathered (the next one started)
  void exit_unit(size_t unit, const torch::Tensor& out);  // local: freed; `out` hooked for the backward
  // The root freed unless a backward will need it; with a backward to come and prefetch on, collective: starts the
  // gather of the last unit entered (the backward's first).
  void end_forward(const torch::Tensor& out);

  const std::vector<std::string>& unit_names() const { return unit_names_; }
  size_t unit_index(const std::string& unit) const;  // ConfigError when it is not a unit
  // The root's parameters (names), e.g. for a log line.
  std::vector<std::string> root_parameter_names() const;

  const char* shard_name() const override { return "parameters"; }
  // Collective (gathers each unit in turn). Copies of the parameters, whole, in parameters() order.
  std::vector<torch::Tensor> full_parameters() override;
  // Local: zeroes this rank's gradient ranges, as after zero_grad() (the next forward gathers the stepped rows).
  void gather_parameters() override;

 protected:
  std::vector<BucketSpec> layout(const std::vector<size_t>& nbytes, const std::vector<int>& group) const override;
  void gradient_done(size_t index) override;
  double reductions_done(size_t unused_here) override;

 private:
  std::string resolve_units(const FsdpOptions& options);  // returns the problem, if any
  void gather_unit(size_t u);                             // collective (or waits for u's prefetch)
  void prefetch_unit(size_t u);                           // collective: u's gather started, not waited for
  void regather_unit(size_t u, size_t next);              // collective: before the unit's backward; prefetches next
  void release_unit(size_t u);                            // local (waits for a gather in flight first)
  size_t root() const { return unit_names_.size(); }      // the root's index in unit_params_
  std::vector<std::string> unit_names_;
  struct Unit {
    std::vector<size_t> params;
    bool gathered = false;
    size_t grads_left = 0;                     // gradients still to accumulate in this backward
    std::vector<std::unique_ptr<Work>> works;  // a prefetch in flight: one allgatherv per parameter
  };
  struct Entry {
    size_t unit;
    bool hooked;  // its output hooked for the backward (so the backward regathers it)
  };
  bool prefetch_ = true;
  bool in_forward_ = false;            // between begin_forward and end_forward
  bool order_known_ = false;           // order_ holds the first (completed) forward's units
  bool predicting_ = false;            // this forward has followed order_ so far
  std::vector<size_t> order_;          // units in the order the first forward entered them
  std::vector<Entry> entries_;         // this forward's units so far
  size_t prefetched_unit_ = SIZE_MAX;  // gathered ahead and not yet entered or regathered
  std::vector<Unit> units_;            // unit_names_ order, then the root
  std::vector<size_t> param_unit_;     // param -> index into units_
  std::vector<size_t> param_nbytes_;   // each parameter's storage size
};

}  // namespace h5ddp

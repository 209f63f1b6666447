// The checkpoint layer's edge on the LibTorch side: TrainState views straight into a model's
// parameters and buffers and an optimizer's per-parameter state (keyed by PARAMETER NAME, not by
// LibTorch's pointer keys), plus the random generators' states as bytes.
// CPU tensors are viewed in place (no copy); tensors on a device are staged through host memory.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "h5ddp/train_state.hpp"

namespace h5ddp {

DType to_dtype(torch::ScalarType t);
torch::ScalarType to_scalar_type(DType t);

// A row range of a model parameter that an optimizer steps as a tensor of its own (element-range sharding:
// DistributedDataParallel::owned_pieces). `tensor` is what the optimizer holds; its state is the state of rows
// [row_begin, row_end) of parameter `name`, exported as those rows of the parameter-shaped tensor.
struct ParamPiece {
  std::string name;
  int64_t row_begin = 0, row_end = 0;
  torch::Tensor tensor;
};

class TorchStateBinding {
 public:
  // `optimizer_type` is "adam", "adamw" or "sgd" and must match the optimizer's class. The model and
  // optimizer must outlive the binding; every optimizer parameter must be a parameter of the model.
  // `sharded` (ZeRO-1): the optimizer holds only this rank's parameters; exported state is marked
  // OptimizerState::sharded and an import allocates state only for the parameters the optimizer holds.
  // `pieces`: tensors the optimizer holds in place of parameters (their rows); the state of a piece that covers
  // only some rows is exported and imported as TensorRef row pieces.
  // `model_sharded` (shard stage 3): the trainable parameters are held as the pieces only (their own storage is
  // empty between uses), so the model is exported and imported as the pieces' rows: every trainable parameter is
  // a TensorRef row piece, with no rows on a rank that holds none of it.
  TorchStateBinding(torch::nn::Module& model, torch::optim::Optimizer& optimizer, std::string optimizer_type,
                    bool sharded = false, std::vector<ParamPiece> pieces = {}, bool model_sharded = false);

  // Local. Fills state.model, state.optimizer (type, groups, per-parameter state) and state.rng with
  // views of the current values. The views stay valid until the next optimizer step or import.
  void export_state(TrainState& state);

  // Local. Prepares `state` as the destination of a load: state.model views the model's parameters
  // and buffers; for each entry of `optimizer_entries` (name "<param>/<key>", dtype, shape, as read
  // from a checkpoint's manifest; data ignored) the optimizer's state is allocated and viewed.
  // An entry naming no parameter of the model or no state of this optimizer gets no destination, and one of
  // another shape gets a destination of the parameter's shape: load_checkpoint then reports every such
  // difference, with those of the model, in one CheckpointMismatchError.
  void prepare_import(const std::vector<TensorRef>& optimizer_entries, TrainState& state);

  // Local. After the load filled the views: writes staged and scalar values back into the model and
  // optimizer (Adam's step counters, device tensors).
  void finish_import();

  // The model's parameter and buffer names in registration order.
  std::vector<std::string> tensor_names() const;

 private:
  struct Staged {
    torch::Tensor target;  // model/optimizer tensor
    torch::Tensor host;    // contiguous CPU copy that the TensorRef points into
  };
  // What the optimizer holds for one parameter: the parameter itself, or a piece of it (row_end >= 0).
  struct Held {
    std::string name;
    torch::Tensor key;
    int64_t row_begin = 0, row_end = -1;
  };
  TensorRef view(const std::string& name, torch::Tensor t);
  TensorRef model_view(const std::string& name, const torch::Tensor& p);  // a parameter (its rows, stage 3)
  TensorRef held_view(const Held& h, const std::string& name, torch::Tensor t);
  const Held& held_of(const torch::Tensor& p) const;
  const Held* held_named(const std::string& name) const;
  void export_optimizer(OptimizerState& out);

  torch::nn::Module& model_;
  torch::optim::Optimizer& optimizer_;
  std::string type_;
  bool sharded_ = false;
  bool model_sharded_ = false;
  std::vector<std::pair<std::string, torch::Tensor>> params_, buffers_;
  std::vector<Held> held_;  // what the optimizer holds, in the model's order
  std::vector<Staged> staged_;
  std::vector<int64_t> steps_;            // Adam step counters (int64 in LibTorch) during save/load
  std::vector<std::string> step_params_;  // their parameter names
};

// Local. This process's generator states: the CPU default generator, and the current CUDA device's when
// CUDA is available.
RngState capture_rng();
// Local. Sets the generators from `rng` (empty parts are left alone).
void restore_rng(const RngState& rng);

// Local. Restores rank `rank`'s generators after a load. With the same world size as at save, rank r
// gets row r bit-exactly. When the world size changed (elastic): ranks r < saved size take row r;
// ranks beyond it seed a fresh stream from (seed, rank, step). Returns true when row r was used.
bool restore_rank_rng(const std::vector<RngState>& rows, int rank, uint64_t seed, int64_t step);

// Local. Seeds this rank's generators from (seed, rank): the dropout stream of a fresh run.
void seed_rank_rng(uint64_t seed, int rank);

}  // namespace h5ddp

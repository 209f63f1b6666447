// Samples as tensors, the loss, and a scored pass over rows: what the trainer's step, its evaluation and
// h5ddp-ckpt eval share, for classification (integer labels: cross-entropy, accuracy) and regression (float
// targets: mean squared error).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <utility>
#include <vector>

#include "h5ddp/comm.hpp"
#include "train/dataset.hpp"

namespace h5ddp {

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// Local. Rows `indices` of `data` as tensors: x [B, *sample shape] float32 (token data: int64 ids [B, T]) and y
// ([B] int64 labels, per-position labels [B, T], or float targets [B] / [B, K]).
std::pair<torch::Tensor, torch::Tensor> batch_tensors(const Dataset& data, const std::vector<int64_t>& indices);

// The training loss of a batch (mean over the batch): cross-entropy, or MSE with the output viewed as y; per-position
// labels: next-token cross-entropy of logits [B, T, V], the mean over the positions not labelled kIgnoreLabel.
torch::Tensor batch_loss(const SampleSpec& spec, const torch::Tensor& out, const torch::Tensor& y);

struct ScoreSums {
  double correct = 0;  // classification: rows (per position: positions) whose argmax is the label
  double loss = 0;     // summed per-row loss (cross-entropy; regression: mean squared error of the row)
  double rows = 0;     // rows scored; per-position labels: positions scored (not kIgnoreLabel)
};

// Rows a scoring forward takes at once: 128, token data about 8192 tokens' worth.
int64_t score_batch_rows(const SampleSpec& spec);

// Local, process-wide (glibc). Freed blocks of up to 64 MiB stay in the heap, and the heap is not trimmed below
// 128 MiB: an evaluation frees every activation after each batch, and giving that memory back to the kernel to fault
// it in again for the next batch cost h5ddp-ckpt eval 2x its CPU time (docs/BENCHMARKS.md "Evaluation speed").
// Not for memory-bound runs (the sharded stages fix a 1 MiB mmap threshold instead). No-op without glibc.
void keep_freed_memory_in_heap();

// How a batch is computed: where (the model's device; batches are moved there) and in which precision.
struct Compute {
  torch::Device device = torch::kCPU;
  bool bf16 = false;  // forward and loss under autocast to bfloat16
};

// RAII: autocast to bfloat16 for `compute.device`'s type while alive (nothing when !compute.bf16). Weights,
// gradients and optimizer state stay float32; autocast runs matmuls and convolutions in bf16 and the loss in
// float32, as torch.autocast does.
class AutocastScope {
 public:
  explicit AutocastScope(const Compute& compute);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool on_, cuda_, was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

// Local. Scores rows [begin, end) of `data` (the caller sets eval mode; no grad here), `batch` rows at a time
// (0: score_batch_rows).
ScoreSums score_rows(const Forward& forward, const Dataset& data, int64_t begin, int64_t end, int64_t batch = 0,
                     const Compute& compute = {});

// Collective. Each rank scores a contiguous share of `data` (score_rows); one allreduce sums the shares, so every
// rank returns the sums over the whole of `data`.
ScoreSums score_distributed(const Forward& forward, const Dataset& data, Comm& comm, const Compute& compute = {});

// Local. Checks that `forward` takes `data`'s samples and returns what its labels or targets need (one row of
// logits per sample; targets of the right width). Returns the model's output width (classes for
// classification). Throws DataError naming the file (data.describe()) and both shapes.
int64_t check_model_accepts(const Forward& forward, const Dataset& data, const Compute& compute = {});

}  // namespace h5ddp

#include "train/batch.hpp"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <sstream>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

std::string sizes_text(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> batch_tensors(const Dataset& data, const std::vector<int64_t>& indices) {
  Rows rows;
  data.read(indices, rows);
  const SampleSpec& spec = data.spec();
  std::vector<int64_t> shape{static_cast<int64_t>(indices.size())};
  shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
  auto x = spec.tokens ? torch::from_blob(rows.ids.data(), shape, torch::kLong).clone()
                       : torch::from_blob(rows.x.data(), shape, torch::kFloat32).clone();
  const int64_t b = static_cast<int64_t>(indices.size());
  if (spec.per_position) return {x, torch::from_blob(rows.labels.data(), shape, torch::kLong).clone()};
  if (spec.classification) return {x, torch::from_blob(rows.labels.data(), {b}, torch::kLong).clone()};
  std::vector<int64_t> yshape{b};
  if (spec.target_width > 0) yshape.push_back(spec.target_width);
  return {x, torch::from_blob(rows.targets.data(), yshape, torch::kFloat32).clone()};
}

torch::Tensor batch_loss(const SampleSpec& spec, const torch::Tensor& out, const torch::Tensor& y) {
  namespace F = torch::nn::functional;
  if (spec.per_position)
    return F::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape(-1),
                            F::CrossEntropyFuncOptions().ignore_index(SampleSpec::kIgnoreLabel));
  if (spec.classification) return F::cross_entropy(out, y);
  return torch::mse_loss(out.reshape(y.sizes()), y);
}

// LibTorch 2.4 (pytorch#124359) replaced the per-device autocast calls (is_enabled, set_cpu_enabled,
// get_autocast_gpu_dtype, ...) by ones taking the device type, deprecated the old ones (a warning on every call)
// and later removed them; 1.13 has only the old ones (issue 43's audit).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define H5DDP_AUTOCAST_BY_DEVICE_TYPE 1
#endif

AutocastScope::AutocastScope(const Compute& compute) : on_(compute.bf16), cuda_(compute.device.is_cuda()) {
  if (!on_) return;
#ifdef H5DDP_AUTOCAST_BY_DEVICE_TYPE
  const at::DeviceType device = cuda_ ? at::kCUDA : at::kCPU;
  was_enabled_ = at::autocast::is_autocast_enabled(device);
  was_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_dtype(device, at::kBFloat16);
  at::autocast::set_autocast_enabled(device, true);
#else
  if (cuda_) {
    was_enabled_ = at::autocast::is_enabled();
    was_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
  } else {
    was_enabled_ = at::autocast::is_cpu_enabled();
    was_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
  }
#endif
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();  // casts of the weights go
#ifdef H5DDP_AUTOCAST_BY_DEVICE_TYPE
  const at::DeviceType device = cuda_ ? at::kCUDA : at::kCPU;
  at::autocast::set_autocast_enabled(device, was_enabled_);
  at::autocast::set_autocast_dtype(device, was_dtype_);
#else
  if (cuda_) {
    at::autocast::set_enabled(was_enabled_);
    at::autocast::set_autocast_gpu_dtype(was_dtype_);
  } else {
    at::autocast::set_cpu_enabled(was_enabled_);
    at::autocast::set_autocast_cpu_dtype(was_dtype_);
  }
#endif
}

// Rows per evaluation forward: a layer's activations stay below keep_freed_memory_in_heap's 64 MiB (at 1000
// Fashion-MNIST images the CNN's first convolution alone is 100 MB, mapped and unmapped for every batch).
int64_t score_batch_rows(const SampleSpec& spec) {
  return spec.tokens ? std::max<int64_t>(1, 8192 / spec.numel()) : 128;
}

void keep_freed_memory_in_heap() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
#endif
}

ScoreSums score_rows(const Forward& forward, const Dataset& data, int64_t begin, int64_t end, int64_t batch,
                     const Compute& compute) {
  torch::NoGradGuard no_grad;
  ScoreSums s;
  const SampleSpec& spec = data.spec();
  if (batch <= 0) batch = score_batch_rows(spec);
  std::vector<int64_t> idx;
  for (int64_t b = begin; b < end; b += batch) {
    const int64_t e = std::min(end, b + batch);
    idx.resize(static_cast<size_t>(e - b));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = b + static_cast<int64_t>(i);
    auto [x, y] = batch_tensors(data, idx);
    x = x.to(compute.device);
    y = y.to(compute.device);
    torch::Tensor out;
    {
      AutocastScope autocast(compute);
      out = forward(x).to(torch::kFloat32);
    }
    if (spec.per_position) {
      namespace F = torch::nn::functional;
      const auto logits = out.reshape({-1, out.size(-1)}), labels = y.reshape(-1);
      const auto scored = labels.ne(SampleSpec::kIgnoreLabel);
      s.correct += static_cast<double>(logits.argmax(1).eq(labels).logical_and(scored).sum().item<int64_t>());
      s.loss +=
          F::cross_entropy(logits, labels,
                           F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(SampleSpec::kIgnoreLabel))
              .item<double>();
      s.rows += static_cast<double>(scored.sum().item<int64_t>());
      continue;
    }
    if (spec.classification) {
      s.correct += static_cast<double>(out.argmax(1).eq(y).sum().item<int64_t>());
      s.loss += torch::nn::functional::cross_entropy(
                    out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    } else {
      const auto per_row = (out.reshape(y.sizes()) - y).pow(2).reshape({e - b, -1}).mean(1);
      s.loss += per_row.sum().item<double>();
    }
    s.rows += static_cast<double>(e - b);
  }
  return s;
}

int64_t check_model_accepts(const Forward& forward, const Dataset& data, const Compute& compute) {
  const SampleSpec& spec = data.spec();
  const int64_t n = std::min<int64_t>(2, data.size());
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  auto [x, y] = batch_tensors(data, idx);
  torch::Tensor out;
  try {
    torch::NoGradGuard no_grad;
    AutocastScope autocast(compute);
    out = forward(x.to(compute.device));
  } catch (const std::exception& e) {
    throw DataError("the model does not take the samples of " + data.describe() + " (sample shape " +
                    spec.shape_text() + ", a batch " + sizes_text(x) + "): " + e.what());
  }
  if (spec.per_position) {
    if (out.dim() != 3 || out.size(0) != n || out.size(1) != spec.shape[0])
      throw DataError("the model returns " + sizes_text(out) + " for a batch " + sizes_text(x) + " of " +
                      data.describe() + "; a language model needs logits [batch, T, vocabulary]");
    return out.size(2);
  }
  if (spec.classification) {
    if (out.dim() != 2 || out.size(0) != n)
      throw DataError("the model returns " + sizes_text(out) + " for a batch " + sizes_text(x) + " of " +
                      data.describe() + "; classification needs logits [batch, classes]");
    return out.size(1);
  }
  const int64_t width = std::max<int64_t>(1, spec.target_width);
  if (out.numel() != n * width)
    throw DataError("the model returns " + sizes_text(out) + " for a batch " + sizes_text(x) + " of " +
                    data.describe() + "; its targets need " + std::to_string(width) + " value(s) per sample");
  return width;
}

ScoreSums score_distributed(const Forward& forward, const Dataset& data, Comm& comm, const Compute& compute) {
  const int64_t n = data.size(), r = comm.rank(), w = comm.size();
  const ScoreSums s = score_rows(forward, data, n * r / w, n * (r + 1) / w, 0, compute);
  // Every rank runs as many forwards as the largest share needs (empty batches pad a smaller one): a model whose
  // layers gather their parameters (shard stage 3) makes each forward collective.
  const int64_t batch = score_batch_rows(data.spec());
  const int64_t mine = (n * (r + 1) / w - n * r / w + batch - 1) / batch, most = ((n + w - 1) / w + batch - 1) / batch;
  if (mine < most) {
    torch::NoGradGuard no_grad;
    auto [x, y] = batch_tensors(data, {0});
    x = x.to(compute.device).narrow(0, 0, 0);
    AutocastScope autocast(compute);
    for (int64_t k = mine; k < most; ++k) forward(x);
  }
  double sums[3] = {s.correct, s.loss, s.rows};
  comm.allreduce(sums, 3, DType::kF64, ReduceOp::kSum);
  return ScoreSums{sums[0], sums[1], sums[2]};
}

}  // namespace h5ddp

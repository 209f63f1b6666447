#include "train/batch.hpp"

#include <sstream>

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
  auto x = torch::from_blob(rows.x.data(), shape, torch::kFloat32).clone();
  const int64_t b = static_cast<int64_t>(indices.size());
  if (spec.classification) return {x, torch::from_blob(rows.labels.data(), {b}, torch::kLong).clone()};
  std::vector<int64_t> yshape{b};
  if (spec.target_width > 0) yshape.push_back(spec.target_width);
  return {x, torch::from_blob(rows.targets.data(), yshape, torch::kFloat32).clone()};
}

torch::Tensor batch_loss(const SampleSpec& spec, const torch::Tensor& out, const torch::Tensor& y) {
  if (spec.classification) return torch::nn::functional::cross_entropy(out, y);
  return torch::mse_loss(out.reshape(y.sizes()), y);
}

ScoreSums score_rows(const Forward& forward, const Dataset& data, int64_t begin, int64_t end, int64_t batch) {
  torch::NoGradGuard no_grad;
  ScoreSums s;
  const SampleSpec& spec = data.spec();
  std::vector<int64_t> idx;
  for (int64_t b = begin; b < end; b += batch) {
    const int64_t e = std::min(end, b + batch);
    idx.resize(static_cast<size_t>(e - b));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = b + static_cast<int64_t>(i);
    auto [x, y] = batch_tensors(data, idx);
    auto out = forward(x);
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

int64_t check_model_accepts(const Forward& forward, const Dataset& data) {
  const SampleSpec& spec = data.spec();
  const int64_t n = std::min<int64_t>(2, data.size());
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  auto [x, y] = batch_tensors(data, idx);
  torch::Tensor out;
  try {
    torch::NoGradGuard no_grad;
    out = forward(x);
  } catch (const std::exception& e) {
    throw DataError("the model does not take the samples of " + data.describe() + " (sample shape " +
                    spec.shape_text() + ", a batch " + sizes_text(x) + "): " + e.what());
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

}  // namespace h5ddp

// The built-in models: output shapes, PyTorch-style state-dict keys, parameter counts (docs/MODELS.md).
#include "train/models.hpp"

#include <gtest/gtest.h>

#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

std::vector<std::string> keys(const torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters(true)) out.push_back(p.key());
  return out;
}

TEST(Models, CnnShapesKeysAndSize) {
  torch::manual_seed(0);
  auto m = make_model(ModelSpec{"cnn", 0.25, {}});
  EXPECT_EQ(keys(*m), (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                                "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  auto p = m->named_parameters(true);
  EXPECT_EQ(p["conv1.weight"].sizes().vec(), (std::vector<int64_t>{32, 1, 3, 3}));
  EXPECT_EQ(p["conv2.weight"].sizes().vec(), (std::vector<int64_t>{64, 32, 3, 3}));
  EXPECT_EQ(p["fc1.weight"].sizes().vec(), (std::vector<int64_t>{128, 1600}));
  EXPECT_EQ(p["fc2.weight"].sizes().vec(), (std::vector<int64_t>{10, 128}));
  EXPECT_EQ(parameter_count(*m), 320 + 18496 + 204928 + 1290);
  EXPECT_EQ(m->forward(torch::randn({5, 1, 28, 28})).sizes().vec(), (std::vector<int64_t>{5, 10}));
  EXPECT_TRUE(m->named_buffers(true).is_empty());
}

TEST(Models, MlpWidthsFromSpec) {
  auto m = make_model(ModelSpec{"mlp", 0.0, {64, 32, 16}});
  EXPECT_EQ(keys(*m), (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight",
                                                "fc3.bias", "fc4.weight", "fc4.bias"}));
  EXPECT_EQ(parameter_count(*m), 784 * 64 + 64 + 64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10);
  EXPECT_EQ(m->forward(torch::randn({3, 1, 28, 28})).sizes().vec(), (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(m->forward(torch::randn({3, 784})).sizes().vec(), (std::vector<int64_t>{3, 10}));
}

TEST(Models, DropoutOnlyInTrainingAndSeedDeterminesInit) {
  torch::manual_seed(3);
  auto a = make_model(ModelSpec{"cnn", 0.5, {}});
  torch::manual_seed(3);
  auto b = make_model(ModelSpec{"cnn", 0.5, {}});
  for (const auto& p : a->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), b->named_parameters()[p.key()]));
  auto x = torch::randn({4, 1, 28, 28});
  a->eval();
  EXPECT_TRUE(torch::equal(a->forward(x), a->forward(x)));
  a->train();
  EXPECT_FALSE(torch::equal(a->forward(x), a->forward(x)));
}

TEST(Models, UnknownModelIsAConfigError) {
  EXPECT_THROW(make_model(ModelSpec{"resnet", 0.1, {}}), ConfigError);
}

}  // namespace
}  // namespace h5ddp

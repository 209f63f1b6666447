// TorchStateBinding: views into the model and optimizer, import into a fresh model/optimizer, and
// continuation that is bitwise identical to never having stopped (no checkpoint file involved).
#include "h5ddp/torch_state.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp_test/test_util.hpp"
#include "train/models.hpp"

namespace h5ddp {
namespace {

std::unique_ptr<torch::optim::Optimizer> make_opt(const std::string& type, Model& m) {
  if (type == "sgd")
    return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  if (type == "adamw") return std::make_unique<torch::optim::AdamW>(m.parameters(), torch::optim::AdamWOptions(1e-3));
  return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-3));
}

void train_steps(Model& m, torch::optim::Optimizer& opt, int steps, int64_t first) {
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(1000 + first + s);  // the data of step `first + s`
    auto x = torch::randn({8, 1, 28, 28});
    auto y = torch::randint(0, 10, {8}, torch::kLong);
    torch::manual_seed(2000 + first + s);  // dropout masks fixed per step, so both runs draw the same ones
    auto loss = torch::nn::functional::cross_entropy(m.forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

// A saved copy of exported views, as a checkpoint file would hold them.
struct Snapshot {
  std::vector<TensorRef> refs;
  std::vector<std::vector<uint8_t>> bytes;
  RngState rng;
};

Snapshot snapshot(const std::vector<TensorRef>& refs, const RngState& rng) {
  Snapshot s{refs, {}, rng};
  for (const auto& r : refs) {
    const auto* p = static_cast<const uint8_t*>(r.data);
    s.bytes.emplace_back(p, p + r.nbytes());
  }
  return s;
}

void fill(std::vector<TensorRef>& dst, const Snapshot& src) {
  ASSERT_EQ(dst.size(), src.refs.size());
  for (size_t i = 0; i < dst.size(); ++i) {
    auto it = std::find_if(src.refs.begin(), src.refs.end(), [&](const TensorRef& r) { return r.name == dst[i].name; });
    ASSERT_NE(it, src.refs.end()) << dst[i].name;
    const size_t j = size_t(it - src.refs.begin());
    ASSERT_EQ(dst[i].nbytes(), src.bytes[j].size()) << dst[i].name;
    std::memcpy(dst[i].data, src.bytes[j].data(), src.bytes[j].size());
  }
}

class Binding : public testing::TestWithParam<std::string> {};

TEST_P(Binding, ImportIntoFreshObjectsContinuesBitwise) {
  const std::string type = GetParam();
  torch::manual_seed(1);
  auto a = make_model(ModelSpec{"cnn", 0.25, {}});
  auto opt_a = make_opt(type, *a);
  train_steps(*a, *opt_a, 3, 0);

  TorchStateBinding bind_a(*a, *opt_a, type);
  TrainState saved;
  bind_a.export_state(saved);
  // Views, not copies: the first model ref points into the parameter itself.
  EXPECT_EQ(saved.model.at(0).name, "conv1.weight");
  EXPECT_EQ(saved.model.at(0).data, a->named_parameters()["conv1.weight"].data_ptr());
  std::vector<std::string> names;
  for (const auto& r : saved.optimizer.state) names.push_back(r.name);
  if (type == "sgd") {
    EXPECT_EQ(names.size(), 8u);
    EXPECT_NE(std::find(names.begin(), names.end(), "fc1.weight/momentum_buffer"), names.end());
  } else {
    EXPECT_EQ(names.size(), 8u * 3);  // exp_avg, exp_avg_sq, step (no amsgrad)
    EXPECT_NE(std::find(names.begin(), names.end(), "conv2.bias/exp_avg_sq"), names.end());
    for (const auto& r : saved.optimizer.state)
      if (r.name == "fc2.bias/step") {
        EXPECT_EQ(*static_cast<int64_t*>(r.data), 3);
      }
  }
  ASSERT_EQ(saved.optimizer.groups.size(), 1u);
  EXPECT_EQ(saved.optimizer.groups[0].params.front(), "conv1.weight");
  EXPECT_GT(saved.optimizer.groups[0].hyper.at("lr"), 0.0);
  const Snapshot model_snap = snapshot(saved.model, saved.rng);
  const Snapshot opt_snap = snapshot(saved.optimizer.state, saved.rng);

  // A different process: other initial weights, empty optimizer.
  torch::manual_seed(99);
  auto b = make_model(ModelSpec{"cnn", 0.25, {}});
  auto opt_b = make_opt(type, *b);
  TorchStateBinding bind_b(*b, *opt_b, type);
  std::vector<TensorRef> entries;
  for (const auto& r : saved.optimizer.state) entries.push_back(TensorRef{r.name, r.dtype, r.shape, nullptr});
  TrainState dst;
  bind_b.prepare_import(entries, dst);
  fill(dst.model, model_snap);
  fill(dst.optimizer.state, opt_snap);
  bind_b.finish_import();

  // Continue both: every parameter must be bitwise equal.
  train_steps(*a, *opt_a, 2, 3);
  train_steps(*b, *opt_b, 2, 3);
  auto pb = b->named_parameters();
  for (const auto& p : a->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Binding, testing::Values("adam", "adamw", "sgd"));

// prepare_import gives no destination to entries that fit no parameter or state of this optimizer, and the
// parameter's shape to the others, so that load_checkpoint can list every difference at once.
TEST(BindingErrors, ForeignEntriesGetNoDestinationAndShapesAreTheModels) {
  auto m = make_model(ModelSpec{"mlp", 0.0, {8}});
  auto opt = make_opt("adam", *m);
  TorchStateBinding bind(*m, *opt, "adam");
  TrainState st;
  bind.prepare_import({TensorRef{"nope.weight/exp_avg", DType::kF32, {8, 784}, nullptr},
                       TensorRef{"fc1.weight/momentum_buffer", DType::kF32, {8, 784}, nullptr},
                       TensorRef{"fc1.weight/exp_avg", DType::kF32, {784, 8}, nullptr}},
                      st);
  ASSERT_EQ(st.optimizer.state.size(), 1u);
  EXPECT_EQ(st.optimizer.state[0].name, "fc1.weight/exp_avg");
  EXPECT_EQ(st.optimizer.state[0].shape, (std::vector<int64_t>{8, 784}));
  // exp_avg without exp_avg_sq would crash Adam later: rejected when the import finishes.
  EXPECT_THROW(bind.finish_import(), CheckpointError);
}

// Issue 23, finding 3: a checkpoint of an MLP 64,64 loaded into the CNN. The error names every difference:
// the CNN's tensors the file lacks, the file's tensors the CNN lacks, the shapes that differ, in the model and
// in the optimizer state (it used to stop at the first optimizer entry of another shape).
TEST(BindingErrors, AnotherModelsCheckpointListsEveryDifference) {
  auto& comm = test::world();
  const std::string dir = test::scratch_dir("binding-mismatch");
  auto mlp = make_model(ModelSpec{"mlp", 0.0, {64, 64}});
  auto mlp_opt = make_opt("adam", *mlp);
  train_steps(*mlp, *mlp_opt, 1, 0);
  TorchStateBinding saver(*mlp, *mlp_opt, "adam");
  TrainState saved;
  saver.export_state(saved);
  saved.counters.step = 1;  // the step taken (docs/FORMAT.md R8: no Adam step beyond /train/step)
  const SaveResult r = save_checkpoint(comm, saved, dir);

  auto cnn = make_model(ModelSpec{"cnn", 0.0, {}});
  auto cnn_opt = make_opt("adam", *cnn);
  TorchStateBinding loader(*cnn, *cnn_opt, "adam");
  const CheckpointManifest manifest = read_manifest(comm, r.path);
  std::vector<TensorRef> entries;
  for (const auto& t : manifest.optimizer_state) entries.push_back(TensorRef{t.name, t.dtype, t.shape, nullptr});
  TrainState dst;
  loader.prepare_import(entries, dst);
  std::string msg;
  try {
    load_checkpoint(comm, r.path, dst);
    ADD_FAILURE() << "an MLP checkpoint loaded into the CNN";
  } catch (const CheckpointMismatchError& e) {
    msg = e.what();
  }
  for (const char* what : {"missing in file: /model/conv1.weight", "missing in file: /model/conv2.bias",
                           "not in the model: /model/fc3.weight", "/model/fc1.weight: expected",
                           "/model/fc1.bias: expected", "/optimizer/state/fc1.bias/exp_avg: expected",
                           "not in the optimizer state: /optimizer/state/fc3.weight/exp_avg", r.path.c_str()})
    EXPECT_NE(msg.find(what), std::string::npos) << "'" << what << "' not in:\n" << msg;
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

// docs/FORMAT.md "Decisions of revision 2": the C++ loader keeps its optimizer's hyperparameters, so a file whose
// amsgrad differs from the loading Adam's (max_exp_avg_sq present or missing) is another model, not a crash later.
TEST(BindingErrors, AnAmsgradDifferenceIsAnotherModel) {
  auto& comm = test::world();
  const std::string dir = test::scratch_dir("binding-amsgrad");
  for (const bool saved_amsgrad : {false, true}) {
    auto a = make_model(ModelSpec{"mlp", 0.0, {8}});
    torch::optim::Adam a_opt(a->parameters(), torch::optim::AdamOptions(1e-3).amsgrad(saved_amsgrad));
    train_steps(*a, a_opt, 1, 0);
    TorchStateBinding saver(*a, a_opt, "adam");
    TrainState saved;
    saver.export_state(saved);
    saved.counters.step = 1;
    const std::string sub = dir + (saved_amsgrad ? "/on" : "/off");
    if (comm.rank() == 0) std::filesystem::create_directories(sub);
    comm.barrier();
    const SaveResult r = save_checkpoint(comm, saved, sub);

    auto b = make_model(ModelSpec{"mlp", 0.0, {8}});
    torch::optim::Adam b_opt(b->parameters(), torch::optim::AdamOptions(1e-3).amsgrad(!saved_amsgrad));
    TorchStateBinding loader(*b, b_opt, "adam");
    std::vector<TensorRef> entries;
    for (const auto& t : read_manifest(comm, r.path).optimizer_state)
      entries.push_back(TensorRef{t.name, t.dtype, t.shape, nullptr});
    TrainState dst;
    loader.prepare_import(entries, dst);
    try {
      load_checkpoint(comm, r.path, dst);
      ADD_FAILURE() << "a file of amsgrad " << saved_amsgrad << " loaded into an Adam of amsgrad " << !saved_amsgrad;
    } catch (const CheckpointMismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("fc1.weight/max_exp_avg_sq"), std::string::npos) << e.what();
    }
  }
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(Rng, CaptureRestoreAndElasticRows) {
  torch::manual_seed(5);
  const RngState s = capture_rng();
  EXPECT_GT(s.cpu.size(), 1000u);  // mt19937 state and more
  const auto x = torch::rand({16});
  restore_rng(s);
  EXPECT_TRUE(torch::equal(x, torch::rand({16})));

  // Row r is restored exactly when present; other ranks get a stream derived from (seed, rank, step).
  EXPECT_TRUE(restore_rank_rng({s}, 0, 7, 10));
  EXPECT_TRUE(torch::equal(x, torch::rand({16})));
  EXPECT_FALSE(restore_rank_rng({s}, 1, 7, 10));
  const auto r1 = torch::rand({16});
  EXPECT_FALSE(restore_rank_rng({s}, 1, 7, 10));
  EXPECT_TRUE(torch::equal(r1, torch::rand({16})));
  EXPECT_FALSE(restore_rank_rng({s}, 2, 7, 10));
  EXPECT_FALSE(torch::equal(r1, torch::rand({16})));
}

}  // namespace
}  // namespace h5ddp

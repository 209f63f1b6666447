#include "train/models.hpp"

#include <algorithm>

#include "h5ddp/ddp.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/script_module.hpp"

namespace h5ddp {

namespace {
constexpr int64_t kImagePixels = 28 * 28;
constexpr int64_t kClasses = 10;
}  // namespace

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : unique_parameters(m)) n += p.numel();  // a tied weight once
  return n;
}

CnnModel::CnnModel(double dropout) : dropout_(dropout) {
  conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)));
  conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)));
  fc1_ = register_module("fc1", torch::nn::Linear(64 * 5 * 5, 128));
  fc2_ = register_module("fc2", torch::nn::Linear(128, kClasses));
}

torch::Tensor CnnModel::forward(torch::Tensor x) {
  x = x.view({-1, 1, 28, 28});
  x = torch::max_pool2d(torch::relu(unit("conv1", [&] { return conv1_->forward(x); })), 2);  // 32 x 13 x 13
  x = torch::max_pool2d(torch::relu(unit("conv2", [&] { return conv2_->forward(x); })), 2);  // 64 x 5 x 5
  x = torch::dropout(x, dropout_, is_training()).flatten(1);
  x = torch::dropout(torch::relu(unit("fc1", [&] { return fc1_->forward(x); })), dropout_, is_training());
  return unit("fc2", [&] { return fc2_->forward(x); });
}

std::string CnnModel::describe() const {
  return "cnn (conv 1->32, conv 32->64, fc 1600->128->10, dropout " + std::to_string(dropout_) + "), " +
         std::to_string(parameter_count(*this)) + " parameters";
}

MlpModel::MlpModel(std::vector<int64_t> hidden, double dropout) : dropout_(dropout), hidden_(std::move(hidden)) {
  int64_t in = kImagePixels;
  for (size_t i = 0; i <= hidden_.size(); ++i) {
    const int64_t out = i < hidden_.size() ? hidden_[i] : kClasses;
    layers_.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(in, out)));
    in = out;
  }
}

torch::Tensor MlpModel::forward(torch::Tensor x) {
  x = x.reshape({x.size(0), -1});
  auto layer = [&](size_t i) { return unit("fc" + std::to_string(i + 1), [&] { return layers_[i]->forward(x); }); };
  for (size_t i = 0; i + 1 < layers_.size(); ++i) x = torch::dropout(torch::relu(layer(i)), dropout_, is_training());
  return layer(layers_.size() - 1);
}

std::string MlpModel::describe() const {
  std::string widths = "784";
  for (int64_t h : hidden_) widths += "->" + std::to_string(h);
  const int64_t n = parameter_count(*this);
  return "mlp (" + widths + "->10, dropout " + std::to_string(dropout_) + "), " + std::to_string(n) + " parameters (" +
         std::to_string(n * 4 / (1 << 20)) + " MiB)";
}

std::shared_ptr<Model> make_model(const ModelSpec& spec) {
  if (spec.name == "cnn") return std::make_shared<CnnModel>(spec.dropout);
  if (spec.name == "mlp") return std::make_shared<MlpModel>(spec.mlp_hidden, spec.dropout);
  throw ConfigError("unknown model '" + spec.name + "' (cnn | mlp)");
}

namespace {
// A layer that holds parameters is a unit (FsdpOptions' default: top-level children); the others just run.
UnitRunner unit_runner(FullyShardedDataParallel& fsdp) {
  return [&fsdp](const std::string& unit, const std::function<torch::Tensor()>& forward) {
    const auto& units = fsdp.unit_names();
    return std::find(units.begin(), units.end(), unit) != units.end() ? fsdp.run_unit(unit, forward) : forward();
  };
}
}  // namespace

TrainModel build_train_model(const ModelSpec& spec) {
  TrainModel m;
  if (!spec.file.empty()) {
    auto script = ScriptModule::load(spec.file);
    const int64_t n = parameter_count(*script);
    m.description = "torchscript " + script->class_name() + " from " + spec.file + " (code " + script->code_hash() +
                    "), " + std::to_string(n) + " parameters";
    m.meta = {{"model", "torchscript"},
              {"model_class", script->class_name()},
              {"model_hash", script->code_hash()},
              {"model_file", spec.file}};
    m.forward = [script](const torch::Tensor& x) { return script->forward(x); };
    m.units = [script](int64_t max_unit_params) {
      // Candidates by size, then what the forward's graph allows: a candidate it never calls, or calls without a
      // tensor or for a non-tensor, is no unit (its parameters join the root, as do those read outside units).
      const UnitPlan plan = script->plan_units(units_by_size(*script, max_unit_params));
      for (const auto& d : plan.dropped) log::root_info("--shard parameters: not a unit: " + d);
      FsdpOptions o;
      o.units = plan.units;
      o.root_parameters = plan.outside;
      return o;
    };
    m.attach_units = [script](FullyShardedDataParallel& fsdp) {
      UnitPlan plan;
      plan.units = fsdp.unit_names();
      UnitCalls calls;  // the root: FullyShardedDataParallel::run_forward around the whole forward
      calls.enter = [&fsdp](size_t u) { fsdp.enter_unit(u); };
      calls.exit = [&fsdp](size_t u, const torch::Tensor& out) { fsdp.exit_unit(u, out); };
      script->set_unit_calls(plan, std::move(calls));
    };
    m.module = script;
    return m;
  }
  auto builtin = make_model(spec);
  m.description = builtin->describe();
  m.meta = {{"model", spec.name}, {"model_description", m.description}, {"dropout", std::to_string(spec.dropout)}};
  if (spec.name == "mlp") {
    std::string w;
    for (int64_t h : spec.mlp_hidden) w += (w.empty() ? "" : ",") + std::to_string(h);
    m.meta.emplace_back("mlp_hidden", w);
  }
  m.forward = [builtin](const torch::Tensor& x) { return builtin->forward(x); };
  m.units = [](int64_t /*max_unit_params*/) { return FsdpOptions{}; };  // the layers: top-level children
  m.attach_units = [builtin](FullyShardedDataParallel& fsdp) { builtin->set_unit_runner(unit_runner(fsdp)); };
  m.module = builtin;
  return m;
}

std::string model_identity_difference(const std::map<std::string, std::string>& saved, const TrainModel& model) {
  std::map<std::string, std::string> ours(model.meta.begin(), model.meta.end());
  auto text = [](const std::map<std::string, std::string>& m) {
    auto get = [&m](const char* k) {
      auto it = m.find(k);
      return it == m.end() ? std::string() : it->second;
    };
    std::string s = get("model");
    if (!get("model_class").empty()) s += " " + get("model_class") + " (code " + get("model_hash") + ")";
    if (!get("model_file").empty()) s += " from " + get("model_file");
    return s;
  };
  bool differs = false;
  for (const char* key : {"model", "model_class", "model_hash"}) {
    auto a = saved.find(key);
    auto b = ours.find(key);
    if (a != saved.end() && b != ours.end() && a->second != b->second) differs = true;
  }
  if (!differs) return "";
  return "it holds the model " + text(saved) + ", this run's model is " + text(ours);
}

}  // namespace h5ddp

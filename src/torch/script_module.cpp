#include "h5ddp/script_module.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

// The line of a LibTorch error that says what went wrong: a TorchScript error carries the script's
// traceback first and the exception ("RuntimeError: ...") last.
std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t") != std::string::npos) last = line;
  const size_t start = last.find_first_not_of(" \t");
  return start == std::string::npos ? text : last.substr(start);
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// FNV-1a over the names and bytes of the archive's code records, in name order.
std::string hash_code_records(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  std::vector<std::string> names;
  for (const auto& name : reader.getAllRecords()) {
    const bool code = name.rfind("code/", 0) == 0 || name.find("/code/") != std::string::npos;
    if (code && name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& name : names) {
    auto [data, size] = reader.getRecord(name);
    h = fnv1a(h, name.data(), name.size() + 1);
    h = fnv1a(h, data.get(), size);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string shape_text(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

}  // namespace

struct ScriptModule::Impl {
  torch::jit::Module script;
  std::string path, class_name, code_hash;
  UnitRunner run;                  // set: forward runs `chain` unit by unit
  std::vector<std::string> chain;  // the top-level children forward calls, in order (sequential_problem)
};

namespace {
// The children a forward graph calls one after the other (each on the previous output), or why it is not such a
// chain. Constants are allowed; anything else is not.
std::string read_chain(const torch::jit::Graph& graph, std::vector<std::string>& chain) {
  chain.clear();
  if (graph.inputs().size() != 2 || graph.outputs().size() != 1) return "forward has other inputs or outputs";
  const torch::jit::Value* self = graph.inputs()[0];
  const torch::jit::Value* current = graph.inputs()[1];
  for (const torch::jit::Node* n : graph.nodes()) {
    const auto kind = n->kind();
    if (kind == c10::prim::Constant || (kind == c10::prim::GetAttr && n->input(0) == self)) continue;
    const bool call = kind == c10::prim::CallMethod && n->s(c10::attr::name) == "forward" && n->inputs().size() == 2 &&
                      n->input(1) == current && n->input(0)->node()->kind() == c10::prim::GetAttr &&
                      n->input(0)->node()->input(0) == self;
    if (!call) return std::string("forward computes ") + kind.toQualString() + " besides calling its children in turn";
    chain.push_back(n->input(0)->node()->s(c10::attr::name));
    current = n->output();
  }
  if (graph.outputs()[0] != current) return "forward does not return its last child's output";
  if (chain.empty()) return "forward calls no child module";
  return "";
}
}  // namespace

std::shared_ptr<ScriptModule> ScriptModule::load(const std::string& path) {
  const std::string where = "--model-file " + path + ": ";
  if (!std::filesystem::is_regular_file(path)) throw ConfigError(where + "no such file");
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  try {
    impl->script = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    throw ConfigError(where + "not a TorchScript module (save one with torch.jit.script(model).save(path)): " +
                      last_line(e.what_without_backtrace()));
  }
  auto forward = impl->script.find_method("forward");
  if (!forward) throw ConfigError(where + "the TorchScript module has no forward method");
  std::vector<std::string> required;
  const auto& args = forward->function().getSchema().arguments();
  for (size_t i = 1; i < args.size(); ++i)
    if (!args[i].default_value()) required.push_back(args[i].name() + ": " + args[i].type()->annotation_str());
  if (required.size() != 1 || !args[1].type()->isSubtypeOf(*c10::TensorType::get())) {
    std::string list;
    for (const auto& r : required) list += (list.empty() ? "" : ", ") + r;
    throw ConfigError(where + "forward must take one tensor (a batch of samples); it takes (" + list + ")");
  }
  impl->class_name = impl->script.type()->name() ? impl->script.type()->name()->qualifiedName() : "unnamed";
  try {
    impl->code_hash = hash_code_records(path);
  } catch (const c10::Error& e) {
    throw ConfigError(where + "cannot read its code records: " + last_line(e.what_without_backtrace()));
  }
  std::shared_ptr<ScriptModule> module(new ScriptModule(std::move(impl)));
  module->mirror();
  module->train(true);
  return module;
}

ScriptModule::ScriptModule(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ScriptModule::~ScriptModule() = default;

// Registers the script's parameters and buffers (the same tensors) in a tree of plain nn::Modules named like
// the script's submodules, so that named_parameters() and named_buffers() give the state_dict() keys.
void ScriptModule::mirror() {
  auto holder = [this](const std::string& dotted, std::string& leaf) -> torch::nn::Module& {
    torch::nn::Module* m = this;
    size_t start = 0;
    for (size_t dot = dotted.find('.'); dot != std::string::npos; start = dot + 1, dot = dotted.find('.', start)) {
      const std::string part = dotted.substr(start, dot - start);
      auto children = m->named_children();
      if (auto* child = children.find(part))
        m = child->get();
      else
        m = m->register_module(part, std::make_shared<torch::nn::Module>()).get();
    }
    leaf = dotted.substr(start);
    return *m;
  };
  std::string leaf;
  for (const auto& p : impl_->script.named_parameters(/*recurse=*/true)) {
    auto& m = holder(p.name, leaf);
    m.register_parameter(leaf, p.value, p.value.requires_grad());
  }
  for (const auto& b : impl_->script.named_buffers(/*recurse=*/true)) {
    auto& m = holder(b.name, leaf);
    m.register_buffer(leaf, b.value);
  }
}

std::string ScriptModule::sequential_problem() const {
  std::vector<std::string> chain;
  return read_chain(*impl_->script.get_method("forward").graph(), chain);
}

void ScriptModule::set_unit_runner(UnitRunner run) {
  const std::string problem = read_chain(*impl_->script.get_method("forward").graph(), impl_->chain);
  if (!problem.empty())
    throw ConfigError("--model-file " + impl_->path + ": shard stage 3 runs the model one top-level child at a time, " +
                      "so its forward must only chain its children (e.g. an nn.Sequential); " + problem);
  impl_->run = std::move(run);
}

torch::Tensor ScriptModule::forward(const torch::Tensor& x) {
  torch::jit::GraphOptimizerEnabledGuard plain_interpreter(false);
  c10::IValue out;
  try {
    if (impl_->run) {
      torch::Tensor y = x;
      for (const std::string& child : impl_->chain) {
        torch::jit::Module m = impl_->script.attr(child).toModule();
        y = impl_->run(child, [&] { return m.forward({y}).toTensor(); });
      }
      return y;
    }
    out = impl_->script.forward({x});
  } catch (const c10::Error& e) {
    throw Error("--model-file " + impl_->path + " rejects an input of shape " + shape_text(x) + ": " +
                last_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {  // torch::jit::JITException (a raise in the script) is not a c10::Error
    throw Error("--model-file " + impl_->path + " rejects an input of shape " + shape_text(x) + ": " +
                last_line(e.what()));
  }
  if (!out.isTensor())
    throw Error("--model-file " + impl_->path + ": forward returned " + out.tagKind() + ", not a tensor");
  return out.toTensor();
}

void ScriptModule::train(bool on) {
  torch::nn::Module::train(on);
  impl_->script.train(on);
}

const std::string& ScriptModule::path() const {
  return impl_->path;
}
const std::string& ScriptModule::class_name() const {
  return impl_->class_name;
}
const std::string& ScriptModule::code_hash() const {
  return impl_->code_hash;
}

}  // namespace h5ddp

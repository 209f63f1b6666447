#include "h5ddp/script_module.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "h5ddp/error.hpp"
#include "torch/script_units.hpp"

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

// Forward with units (set_unit_calls): the rewritten copy of the forward graph and the callbacks its operators
// reach through the registry entry `id`.
struct UnitRun {
  std::shared_ptr<const UnitCalls> calls;
  int64_t id = -1;
  std::unique_ptr<torch::jit::GraphFunction> function;
  ~UnitRun() {
    if (id >= 0) script_units::remove_calls(id);
  }
};

}  // namespace

struct ScriptModule::Impl {
  torch::jit::Module script;
  std::string path, class_name, code_hash;
  std::unique_ptr<UnitRun> units;  // set: forward runs units->function
};

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

UnitPlan ScriptModule::plan_units(const std::vector<std::string>& candidates) const {
  script_units::check_candidates(impl_->script, candidates, "--model-file " + impl_->path + ": ");
  return script_units::plan(impl_->script, candidates);
}

void ScriptModule::set_unit_calls(const UnitPlan& plan, UnitCalls calls) {
  const std::string where = "--model-file " + impl_->path + ": ";
  script_units::check_candidates(impl_->script, plan.units, where);
  if (plan.units.empty()) {
    impl_->units.reset();
    return;
  }
  auto run = std::make_unique<UnitRun>();
  run->calls = std::make_shared<const UnitCalls>(std::move(calls));
  run->id = script_units::add_calls(run->calls);
  run->function = script_units::rewrite(impl_->script, plan.units, run->id, where);
  impl_->units = std::move(run);
}

torch::Tensor ScriptModule::forward(const torch::Tensor& x) {
  torch::jit::GraphOptimizerEnabledGuard plain_interpreter(false);
  const UnitRun* run = impl_->units.get();
  const UnitCalls* calls = run ? run->calls.get() : nullptr;
  script_units::take_callback_failure();
  if (calls && calls->begin_forward) calls->begin_forward();
  const auto fail = [&](const std::string& why) {
    std::exception_ptr failure = script_units::take_callback_failure();
    if (calls && calls->end_forward) calls->end_forward(torch::Tensor());
    if (failure) std::rethrow_exception(failure);  // a callback's own exception, not the interpreter's copy
    throw Error("--model-file " + impl_->path + why);
  };
  c10::IValue out;
  try {
    out = run ? (*run->function)({impl_->script._ivalue(), x}) : impl_->script.forward({x});
  } catch (const c10::Error& e) {
    fail(" rejects an input of shape " + shape_text(x) + ": " + last_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {  // torch::jit::JITException (a raise in the script) is not a c10::Error
    fail(" rejects an input of shape " + shape_text(x) + ": " + last_line(e.what()));
  }
  if (!out.isTensor()) fail(": forward returned " + out.tagKind() + ", not a tensor");
  if (calls && calls->end_forward) calls->end_forward(out.toTensor());
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

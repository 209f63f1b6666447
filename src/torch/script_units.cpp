#include "torch/script_units.hpp"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/library.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

#include "h5ddp/error.hpp"

namespace h5ddp::script_units {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// ---- the operators --------------------------------------------------------------------------------------------

std::mutex registry_mutex;
std::map<int64_t, std::shared_ptr<const UnitCalls>> registry;
int64_t next_id = 0;
thread_local std::exception_ptr callback_failure;

std::shared_ptr<const UnitCalls> find_calls(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry.find(id);
  return it == registry.end() ? nullptr : it->second;
}

// Runs a callback outside the registry lock (it may be collective, or run a nested forward), remembering what it
// threw for ScriptModule::forward.
template <class F>
void call_back(F&& f) {
  try {
    f();
  } catch (...) {
    callback_failure = std::current_exception();
    throw;
  }
}

// Both return their input itself: no autograd node, so the caller's hooks land on the real tensors.
at::Tensor enter_op(int64_t id, int64_t unit, const at::Tensor& x) {
  auto calls = find_calls(id);
  if (calls && calls->enter) call_back([&] { calls->enter(static_cast<size_t>(unit)); });
  return x;
}

at::Tensor exit_op(int64_t id, int64_t unit, const at::Tensor& y) {
  auto calls = find_calls(id);
  if (calls && calls->exit) call_back([&] { calls->exit(static_cast<size_t>(unit), y); });
  return y;
}

// CONSERVATIVE: the interpreter treats them as having side effects (never dropped as dead code, never moved).
// That kind forbids alias annotations in the schema, so the outputs are declared as fresh tensors; nothing
// optimises the rewritten graph (forward runs it with the graph executor's optimisations off).
TORCH_LIBRARY(h5ddp_units, m) {
  m.def(torch::schema("enter(int id, int unit, Tensor x) -> Tensor", c10::AliasAnalysisKind::CONSERVATIVE),
        TORCH_FN(enter_op));
  m.def(torch::schema("exit(int id, int unit, Tensor y) -> Tensor", c10::AliasAnalysisKind::CONSERVATIVE),
        TORCH_FN(exit_op));
}

// ---- the walk -------------------------------------------------------------------------------------------------

bool is_tensor(const Value* v) {
  return v->type()->isSubtypeOf(*c10::TensorType::get());
}

// Index of the first tensor argument of a method call (input 0 is the module), or 0 if none.
size_t first_tensor_argument(const Node* call) {
  for (size_t i = 1; i < call->inputs().size(); ++i)
    if (is_tensor(call->input(i))) return i;
  return 0;
}

std::string join(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

// Walks a copy of forward's graph with a given set of units: inlines every method call of a module that is not a
// unit (so the calls made from inside it are seen), follows module values from `self` through GetAttr chains to
// their state-dict paths, and records the unit calls and the parameters read outside them.
class Walk {
 public:
  struct Call {
    Node* node;
    size_t unit;
  };

  Walk(const torch::jit::Module& script, std::vector<std::string> units) : units_(std::move(units)) {
    problem_.assign(units_.size(), "");
    called_.assign(units_.size(), false);
    // Every name of each parameter tensor: a tied tensor read under one name is read under all.
    std::unordered_map<const c10::TensorImpl*, std::vector<std::string>> by_tensor;
    std::vector<std::pair<std::string, const c10::TensorImpl*>> names;
    for (const auto& p : script.named_parameters(/*recurse=*/true)) {
      by_tensor[p.value.unsafeGetTensorImpl()].push_back(p.name);
      names.emplace_back(p.name, p.value.unsafeGetTensorImpl());
    }
    for (const auto& [name, impl] : names) tied_[name] = by_tensor[impl];
    graph_ = script.get_method("forward").graph()->copy();
    path_[graph_->inputs()[0]] = "";
    block(graph_->block());
    for (size_t u = 0; u < units_.size(); ++u)
      if (!called_[u]) problem_[u] = "never called by forward";
  }

  std::shared_ptr<Graph> graph() const { return graph_; }
  const std::vector<std::string>& units() const { return units_; }
  const std::vector<Call>& calls() const { return calls_; }
  // Per unit: empty, or why it cannot be a unit.
  const std::vector<std::string>& problems() const { return problem_; }
  // Unit indices in the order forward first calls them.
  const std::vector<size_t>& order() const { return order_; }
  const std::vector<std::string>& outside() const { return outside_; }

 private:
  void block(Block* b) {
    for (Node* n = *b->nodes().begin(); n != b->return_node();) {
      if (n->kind() == c10::prim::GetAttr) {
        get_attr(n);
      } else if (n->kind() == c10::prim::CallMethod && path_.count(n->input(0))) {
        const std::string path = path_.at(n->input(0));
        auto unit = std::find(units_.begin(), units_.end(), path);
        if (unit == units_.end()) {  // inline it: its nodes go before it, so carry on from the node before
          Node* before = n->prev();
          inline_call(n);
          n = before->next();
          continue;
        }
        unit_call(n, static_cast<size_t>(unit - units_.begin()));
      }
      for (Block* sub : n->blocks()) block(sub);
      n = n->next();
    }
  }

  void get_attr(Node* n) {
    auto it = path_.find(n->input(0));
    if (it == path_.end()) return;
    const std::string name = join(it->second, n->s(c10::attr::name));
    auto cls = n->output()->type()->cast<c10::ClassType>();
    if (cls && cls->is_module()) {
      path_[n->output()] = name;
      return;
    }
    auto tied = tied_.find(name);
    if (tied == tied_.end()) return;  // a buffer, a constant, a flag
    for (const auto& t : tied->second)
      if (outside_set_.insert(t).second) outside_.push_back(t);
  }

  void inline_call(Node* n) {
    auto cls = n->input(0)->type()->expect<c10::ClassType>();
    auto& callee = torch::jit::toGraphFunction(cls->getMethod(n->s(c10::attr::name)));
    // The callee's own graph, not its optimized_graph(): that one has its calls inlined, units' included.
    auto callee_graph = callee.graph();
    torch::jit::inlineCallTo(n, &callee, callee_graph.get());
  }

  void unit_call(Node* n, size_t u) {
    if (!called_[u]) order_.push_back(u);
    called_[u] = true;
    if (!problem_[u].empty()) return;
    if (first_tensor_argument(n) == 0)
      problem_[u] = "its call takes no tensor";
    else if (n->outputs().size() != 1 || !is_tensor(n->output()))
      problem_[u] = "returns " + (n->outputs().size() == 1 ? n->output()->type()->annotation_str() : "nothing") +
                    ", not a tensor";
    calls_.push_back({n, u});
  }

  std::vector<std::string> units_;
  std::shared_ptr<Graph> graph_;
  std::unordered_map<const Value*, std::string> path_;  // module values -> state-dict path ("" for self)
  std::unordered_map<std::string, std::vector<std::string>> tied_;
  std::vector<std::string> problem_;
  std::vector<bool> called_;
  std::vector<size_t> order_;
  std::vector<Call> calls_;
  std::vector<std::string> outside_;
  std::set<std::string> outside_set_;
};

}  // namespace

void check_candidates(const torch::jit::Module& script, const std::vector<std::string>& candidates,
                      const std::string& where) {
  std::set<std::string> modules;
  for (const auto& m : script.named_modules())
    if (!m.name.empty()) modules.insert(m.name);
  std::set<std::string> seen;
  for (const auto& c : candidates) {
    if (!modules.count(c)) throw ConfigError(where + "'" + c + "' is not a submodule of the script");
    if (!seen.insert(c).second) throw ConfigError(where + "unit '" + c + "' is listed twice");
  }
  for (const auto& a : candidates)
    for (const auto& b : candidates)
      if (b.size() > a.size() && b.compare(0, a.size() + 1, a + ".") == 0)
        throw ConfigError(where + "units '" + a + "' and '" + b + "' nest; a unit cannot hold another");
}

UnitPlan plan(const torch::jit::Module& script, const std::vector<std::string>& candidates) {
  // A candidate that cannot be a unit is inlined like any other module, so what is read outside the units
  // changes: walk again without it until every remaining candidate is a unit.
  UnitPlan plan;
  std::vector<std::string> units = candidates;
  for (;;) {
    Walk walk(script, units);
    std::vector<std::string> kept;
    for (size_t u = 0; u < units.size(); ++u)
      if (walk.problems()[u].empty())
        kept.push_back(units[u]);
      else
        plan.dropped.push_back(units[u] + ": " + walk.problems()[u]);
    if (kept.size() == units.size()) {
      for (size_t u : walk.order()) plan.units.push_back(units[u]);
      plan.outside = walk.outside();
      break;
    }
    units = std::move(kept);
  }
  // Report the dropped candidates in the caller's order.
  std::vector<std::string> dropped;
  for (const auto& c : candidates)
    for (const auto& d : plan.dropped)
      if (d.compare(0, c.size() + 2, c + ": ") == 0) dropped.push_back(d);
  plan.dropped = std::move(dropped);
  return plan;
}

std::unique_ptr<torch::jit::GraphFunction> rewrite(const torch::jit::Module& script,
                                                   const std::vector<std::string>& units, int64_t id,
                                                   const std::string& where) {
  Walk walk(script, units);
  for (size_t u = 0; u < units.size(); ++u)
    if (!walk.problems()[u].empty())
      throw ConfigError(where + "'" + units[u] + "' cannot be a unit: " + walk.problems()[u]);
  Graph& g = *walk.graph();
  static const auto enter = c10::Symbol::fromQualString("h5ddp_units::enter");
  static const auto exit = c10::Symbol::fromQualString("h5ddp_units::exit");
  for (const auto& call : walk.calls()) {
    Node* n = call.node;
    const auto unit = static_cast<int64_t>(call.unit);
    const size_t arg = first_tensor_argument(n);
    {
      torch::jit::WithInsertPoint before(n);
      Value* x = n->input(arg);
      Value* entered = g.insert(enter, {id, unit, x});
      entered->setType(x->type());
      n->replaceInput(arg, entered);
    }
    torch::jit::WithInsertPoint after(n->next());
    Value* out = n->output();
    Value* exited = g.insert(exit, {id, unit, out});
    exited->setType(out->type());
    out->replaceAllUsesWith(exited);
    exited->node()->replaceInput(2, out);
  }
  g.lint();
  const auto& forward = script.get_method("forward").function();
  auto fn =
      std::make_unique<torch::jit::GraphFunction>(forward.qualname().qualifiedName() + "_units", walk.graph(), nullptr);
  fn->setSchema(forward.getSchema());
  return fn;
}

int64_t add_calls(std::shared_ptr<const UnitCalls> calls) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry[next_id] = std::move(calls);
  return next_id++;
}

void remove_calls(int64_t id) noexcept {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.erase(id);
}

std::exception_ptr take_callback_failure() noexcept {
  return std::exchange(callback_failure, nullptr);
}

}  // namespace h5ddp::script_units

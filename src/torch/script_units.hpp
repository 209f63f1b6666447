// The units of a TorchScript forward (ScriptModule::plan_units, set_unit_calls): the graph walk that finds unit
// calls and the parameters read outside them, and the h5ddp_units::enter/exit operators that call back around
// each unit call. Private to h5ddp_torch.
#pragma once

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "h5ddp/script_module.hpp"

namespace h5ddp::script_units {

// Local. Throws ConfigError (prefixed by `where`) when a name is not a submodule of `script`, is listed twice, or
// two names nest ("h" and "h.0").
void check_candidates(const torch::jit::Module& script, const std::vector<std::string>& candidates,
                      const std::string& where);

// Local. See ScriptModule::plan_units; `candidates` are checked.
UnitPlan plan(const torch::jit::Module& script, const std::vector<std::string>& candidates);

// Local. A function running a copy of `script`'s forward in which every call of units[u] goes through
// h5ddp_units::enter(id, u, first tensor argument) and h5ddp_units::exit(id, u, output). Throws ConfigError
// (prefixed by `where`) when one of `units` cannot be a unit.
std::unique_ptr<torch::jit::GraphFunction> rewrite(const torch::jit::Module& script,
                                                   const std::vector<std::string>& units, int64_t id,
                                                   const std::string& where);

// Thread-safe. The operators of registry entry `id` call `calls`; remove_calls(id) ends that.
int64_t add_calls(std::shared_ptr<const UnitCalls> calls);
void remove_calls(int64_t id) noexcept;

// The exception a callback threw inside the interpreter on this thread since the last call, if any (the
// interpreter rethrows it as a plain runtime_error; the caller rethrows this one instead, type and all).
std::exception_ptr take_callback_failure() noexcept;

}  // namespace h5ddp::script_units

// h5ddp-ckpt info FILE
#include <cstdio>

#include "ckpt/subcommands.hpp"
#include "h5ddp/checkpoint.hpp"

namespace h5ddp::ckpt_tool {
namespace {
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace

int run_info(const Args& args) {
  if (args.size() != 1) {
    std::fprintf(stderr, "usage: h5ddp-ckpt info FILE\n");
    return 2;
  }
  CheckpointFile file(args[0]);
  const CheckpointManifest& m = file.manifest();
  std::printf("file            %s\n", args[0].c_str());
  std::printf("format          h5ddp-checkpoint version %d\n", m.format_version);
  std::printf("step            %lld\n", static_cast<long long>(m.step));
  std::printf("world size      %d (at save)\n", m.world_size);
  std::printf("written by      h5ddp %s, LibTorch %s, at %s\n", m.h5ddp_version.c_str(), m.torch_version.c_str(),
              m.created.c_str());
  std::printf("optimizer       %s, %zu param group(s)\n",
              m.optimizer_type.empty() ? "(none)" : m.optimizer_type.c_str(), m.param_groups.size());
  for (size_t g = 0; g < m.param_groups.size(); ++g) {
    std::printf("  group %zu:     %zu params;", g, m.param_groups[g].params.size());
    for (const auto& [k, v] : m.param_groups[g].hyper) std::printf(" %s=%g", k.c_str(), v);
    std::printf("\n");
  }
  const SchedulerState sched = file.scheduler();
  std::printf("lr scheduler    %s", sched.type.empty() ? "(none)" : sched.type.c_str());
  for (const auto& [k, v] : sched.values) std::printf(" %s=%g", k.c_str(), v);
  std::printf("\n");
  for (const auto& [k, v] : file.meta()) std::printf("meta            %s = %s\n", k.c_str(), v.c_str());

  std::printf("\n%-56s %-9s %-18s %12s\n", "dataset", "dtype", "shape", "bytes");
  uint64_t total = 0;
  size_t count = 0;
  std::string group;
  for (const auto& d : file.datasets()) {
    const std::string parent = d.name.substr(0, d.name.rfind('/'));
    if (parent != group) std::printf("%s/\n", (group = parent).c_str());
    std::printf("  %-54s %-9s %-18s %12s\n", d.name.substr(parent.size() + 1).c_str(), dtype_name(d.dtype),
                shape_text(d.shape).c_str(), human_bytes(d.nbytes()).c_str());
    total += d.nbytes();
    ++count;
  }
  std::printf("\ntotals          %zu model tensors, %zu optimizer state tensors%s (%s); %zu datasets, %s\n",
              m.model.size(), m.optimizer_state.size(),
              m.user.empty() ? "" : (", " + std::to_string(m.user.size()) + " user tensors").c_str(),
              human_bytes(m.tensor_bytes).c_str(), count, human_bytes(total).c_str());
  return 0;
}

}  // namespace h5ddp::ckpt_tool

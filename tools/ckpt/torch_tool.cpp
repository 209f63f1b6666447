// export / import / eval: h5ddp-ckpt hands these to h5ddp-ckpt-torch (tools/h5ddp_ckpt_torch.cpp), the one
// checkpoint tool that links LibTorch, by exec'ing it from h5ddp-ckpt's own directory.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "ckpt/subcommands.hpp"

namespace h5ddp::ckpt_tool {
namespace {

int exec_torch_tool(const char* command, const Args& args) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path tool = (ec ? fs::path(".") : self.parent_path()) / "h5ddp-ckpt-torch";
  std::vector<std::string> argv_s = {tool.string(), command};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(tool.c_str(), argv.data());  // returns only on failure
  throw std::runtime_error("cannot run " + tool.string() + ": " + std::strerror(errno) +
                           " (export, import and eval need h5ddp-ckpt-torch, built with LibTorch, next to h5ddp-ckpt)");
}

}  // namespace

int run_export(const Args& args) {
  return exec_torch_tool("export", args);
}
int run_import(const Args& args) {
  return exec_torch_tool("import", args);
}
int run_eval(const Args& args) {
  return exec_torch_tool("eval", args);
}

}  // namespace h5ddp::ckpt_tool

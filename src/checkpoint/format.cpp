#include "h5ddp/format.hpp"

#include <cctype>
#include <cstdio>

#include "h5ddp/error.hpp"

namespace h5ddp::format {
namespace {

void check_component(const std::string& s, const std::string& what) {
  if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..")
    throw CheckpointError("invalid " + what + " '" + s + "': must be non-empty and contain no '/'");
}

}  // namespace

std::string model_dataset(const std::string& key) {
  check_component(key, "model key");
  if (key.rfind("module.", 0) == 0)
    throw CheckpointError("model key '" + key + "' has a DDP 'module.' prefix; checkpoints store the bare key");
  return std::string(kModelGroup) + "/" + key;
}

std::string user_dataset(const std::string& key) {
  check_component(key, "user state name");
  return std::string(kUserGroup) + "/" + key;
}

std::string optimizer_state_dataset(const std::string& entry_name) {
  const size_t slash = entry_name.rfind('/');
  if (slash == std::string::npos)
    throw CheckpointError("optimizer state entry '" + entry_name + "' is not of the form <param>/<key>");
  check_component(entry_name.substr(0, slash), "optimizer state parameter name");
  check_component(entry_name.substr(slash + 1), "optimizer state key");
  return std::string(kOptimizerStateGroup) + "/" + entry_name;
}

std::string optimizer_state_entry(const std::string& dataset_path) {
  const std::string prefix = std::string(kOptimizerStateGroup) + "/";
  if (dataset_path.rfind(prefix, 0) != 0)
    throw CheckpointError("'" + dataset_path + "' is not under " + kOptimizerStateGroup);
  return dataset_path.substr(prefix.size());
}

std::string param_group_path(size_t index) {
  return std::string(kParamGroupsGroup) + "/" + std::to_string(index);
}

std::string checkpoint_file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%08lld%s", kCheckpointPrefix, static_cast<long long>(step), kCheckpointSuffix);
  return buf;
}

int64_t checkpoint_step_from_name(const std::string& name) {
  const std::string prefix = kCheckpointPrefix, suffix = kCheckpointSuffix;
  if (name.size() <= prefix.size() + suffix.size()) return -1;
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 18) return -1;
  for (char c : digits)
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  return std::stoll(digits);
}

}  // namespace h5ddp::format

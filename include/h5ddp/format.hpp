// The checkpoint file format (docs/FORMAT.md) in one place: every group, dataset and attribute name as a
// constant, plus the few helpers that build per-key paths. No other file spells a path by hand.
#pragma once

#include <cstdint>
#include <string>

namespace h5ddp::format {

inline constexpr const char* kFormatName = "h5ddp-checkpoint";
inline constexpr int64_t kFormatVersion = 1;

// ---- root attributes ----
inline constexpr const char* kAttrFormat = "format";
inline constexpr const char* kAttrFormatVersion = "format_version";
// Optional (absent = 0): the revision of version 1 the writer implements (docs/FORMAT.md "Unknown objects").
inline constexpr const char* kAttrFormatMinorVersion = "format_minor_version";
inline constexpr const char* kAttrH5ddpVersion = "h5ddp_version";
inline constexpr const char* kAttrTorchVersion = "torch_version";
inline constexpr const char* kAttrCreated = "created";
inline constexpr const char* kAttrWorldSize = "world_size";
inline constexpr const char* kAttrStep = "step";

// ---- attributes of every dataset ----
inline constexpr const char* kAttrDtype = "dtype";
inline constexpr const char* kAttrChecksum = "xxh3";

// ---- groups and datasets ----
inline constexpr const char* kModelGroup = "/model";
inline constexpr const char* kOptimizerGroup = "/optimizer";
inline constexpr const char* kAttrOptimizerType = "type";
inline constexpr const char* kParamGroupsGroup = "/optimizer/param_groups";
inline constexpr const char* kParamNamesDataset = "params";  // inside each param group
inline constexpr const char* kOptimizerStateGroup = "/optimizer/state";
inline constexpr const char* kTrainGroup = "/train";
inline constexpr const char* kTrainStep = "/train/step";
inline constexpr const char* kTrainEpoch = "/train/epoch";
inline constexpr const char* kTrainSamplesConsumed = "/train/samples_consumed";
inline constexpr const char* kSchedulerGroup = "/train/lr_scheduler";
inline constexpr const char* kAttrSchedulerType = "type";
inline constexpr const char* kDataGroup = "/data";
inline constexpr const char* kDataSeed = "/data/seed";
inline constexpr const char* kDataEpoch = "/data/epoch";
inline constexpr const char* kDataPosition = "/data/position";
inline constexpr const char* kDataGlobalBatch = "/data/global_batch";
inline constexpr const char* kRngGroup = "/rng";
inline constexpr const char* kRngCpu = "/rng/cpu";
inline constexpr const char* kRngCuda = "/rng/cuda";
inline constexpr const char* kMetaGroup = "/meta";
// The caller's own state (Checkpointer::track: an EMA copy, a counter): written only when there is some.
inline constexpr const char* kUserGroup = "/user";

// ---- files in a run directory ----
inline constexpr const char* kCheckpointPrefix = "ckpt-";
inline constexpr const char* kCheckpointSuffix = ".h5";
inline constexpr const char* kPartialSuffix = ".partial";
inline constexpr const char* kLatestFile = "latest";

// "/model/<key>". Throws CheckpointError when the key is empty, contains '/', or starts with "module.".
std::string model_dataset(const std::string& key);
// "/user/<key>". Throws CheckpointError when the key is empty or contains '/'.
std::string user_dataset(const std::string& key);
// "/optimizer/state/<param>/<key>" from an OptimizerState entry name "<param>/<key>"; throws on a bad name.
std::string optimizer_state_dataset(const std::string& entry_name);
// Inverse of optimizer_state_dataset: "/optimizer/state/a.b/exp_avg" -> "a.b/exp_avg".
std::string optimizer_state_entry(const std::string& dataset_path);
// "/optimizer/param_groups/<i>".
std::string param_group_path(size_t index);
// "ckpt-%08lld.h5" of the step.
std::string checkpoint_file_name(int64_t step);
// Step of a file named "ckpt-<digits>.h5", or -1 for any other name (including "*.partial").
int64_t checkpoint_step_from_name(const std::string& file_name);

}  // namespace h5ddp::format

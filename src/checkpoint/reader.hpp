// Opening a checkpoint and reading its manifest (private to h5ddp_checkpoint): what the loader, verification and
// CheckpointFile start from.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <string>
#include <vector>

#include "checkpoint/plan.hpp"
#include "h5/h5.hpp"
#include "h5ddp/checkpoint.hpp"

namespace h5ddp::ckpt {

// Opens a checkpoint for reading: collectively with MPI-IO over comm's communicator (comm != nullptr) or by this
// process alone. Throws CheckpointError for a missing, non-HDF5, non-h5ddp or unsupported-version file.
h5::Handle open_checkpoint(MpiComm* comm, const std::string& path, const MpiioHints& hints = {});
// Test-only: how many files open_checkpoint has opened (H5Fopen) in this process so far; a test asserts that a
// resume opens its checkpoint exactly once per rank.
int checkpoint_opens();
// The manifest of a file whose layout keeps docs/FORMAT.md's rules, from one walk of its metadata; throws
// CheckpointError listing every problem otherwise (damage: a loader refuses the file before it compares it with
// anything).
CheckpointManifest read_valid_manifest(hid_t file, const std::string& path);
// Reads the manifest from an open file (collective when the file was opened collectively).
CheckpointManifest read_manifest_from(hid_t file, const std::string& path);
// The `n` elements of the open fixed-length strings dataset `ds` of file type `type`, each up to its first NUL.
std::vector<std::string> read_string_elements(hid_t ds, hid_t type, size_t n);
// Every dataset the manifest says the file holds (tensors, names, counters, rng), dst/src unset.
std::vector<DatasetPlan> manifest_datasets(hid_t file, const CheckpointManifest& m);

}  // namespace h5ddp::ckpt

// What a load learns from a checkpoint's metadata, read once per job (private to h5ddp_checkpoint): rank 0 opens
// the file alone with HDF5, checks every rule in one walk, reads the small datasets and the tensors' file offsets,
// and broadcasts it all in one message; the other ranks never open the file with HDF5 and read only tensor bytes
// at those offsets (docs/DESIGN.md "A load reads the metadata once per job").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/plan.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/train_state.hpp"

namespace h5ddp::ckpt {

// A small dataset (counters, data position, generators) as rank 0 read it: path, dtype, shape and the file's
// xxh3 in `plan`, its bytes.
struct SmallDataset {
  DatasetPlan plan;
  std::vector<uint8_t> bytes;
};

struct LoadSource {
  CheckpointManifest manifest;
  // Counters, data position, generators (rng_by_rank), scheduler and meta: the file's values, every small
  // dataset verified against its xxh3 on this rank.
  TrainState small;
  // File offset of each tensor dataset (model, optimizer state, user) whose bytes a plain read gives exactly
  // (contiguous, allocated, stored as its dtype); `raw` when every one of them has one.
  std::map<std::string, uint64_t> offsets;
  bool raw = false;
};

// The small datasets every file holds (counters, data position, generators; /rng/cuda when the manifest has it).
std::vector<const char*> small_dataset_paths(const CheckpointManifest& m);

// Collective. The checkpoint's manifest, small state and raw offsets, read by rank 0 and shared with one broadcast
// (MPI's tree: log2(ranks) steps). A file that is missing, not a checkpoint, damaged (a rule of docs/FORMAT.md
// broken, a small dataset whose bytes do not give its xxh3): the same CheckpointError on every rank, naming the
// file and the dataset, before anything is kept.
LoadSource read_load_source(MpiComm& comm, const std::string& path);

// The wire form of a LoadSource (pure; tests compare a round trip). decode throws CheckpointError for a message
// that ends early or has bytes left over.
std::string encode_load_source(const LoadSource& s, const std::vector<SmallDataset>& small);
LoadSource decode_load_source(const std::string& wire, const std::string& path, std::vector<SmallDataset>* small);

}  // namespace h5ddp::ckpt

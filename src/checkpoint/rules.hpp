// docs/FORMAT.md's definition of a valid file, in one place: what a file holds (FileFacts, read in one walk of
// its objects and attributes), the rules over those facts (pure), and the rules over the values a reader reads
// (counters, Adam steps). h5ddp-ckpt verify, load_checkpoint and save_checkpoint (on the state it is about to
// write) all decide with these functions, so a file verifies exactly when it loads.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/train_state.hpp"

namespace h5ddp::ckpt {

// The revision of docs/FORMAT.md this reader and writer implement (root attribute format_minor_version).
inline constexpr int64_t kFormatMinorVersion = 2;

// An attribute as the rules see it: its kind (only scalar string, int64, uint64 and float64 have one) and value.
struct AttrFact {
  enum class Kind { kString, kInt64, kUint64, kFloat64, kOther };
  Kind kind = Kind::kOther;
  std::string text;    // kString
  int64_t i = 0;       // kInt64
  uint64_t u = 0;      // kUint64
  double d = 0;        // kFloat64
  bool scalar = true;  // a scalar dataspace (R18); false: a one-element array (kind read), or none or several
};

// One object of the file (a group or a dataset) with its attributes.
struct ObjectFact {
  enum class Kind { kGroup, kDataset, kLink, kOther };  // kLink: a soft, external or user-defined link (R20)
  Kind kind = Kind::kOther;
  std::string link;  // kLink: "soft", "external" or "user-defined"
  std::map<std::string, AttrFact> attrs;
  // Datasets: the shape, and whether the HDF5 type is the one the dtype attribute names (FORMAT.md "Dtypes";
  // for `string`, a fixed-length NUL-padded ASCII/UTF-8 string type).
  std::vector<int64_t> shape;
  bool type_matches = false;
  bool null_space = false;  // an H5S_NULL dataspace (R21)
  // Where the dataset's bytes lie when a plain read of [offset, offset + storage) gives exactly its elements:
  // contiguous layout, allocated, no external file (H5Dget_offset); kNoOffset otherwise (chunked, compact, after
  // h5repack with filters, not yet written). Whether the type needs no conversion is type_matches.
  static constexpr uint64_t kNoOffset = ~uint64_t{0};
  uint64_t offset = kNoOffset;
  uint64_t storage = 0;              // H5Dget_storage_size
  std::vector<std::string> strings;  // a strings dataset of the right type: its elements
  std::string dtype() const;         // the dtype attribute's text, "" when absent or not a string
};

struct FileFacts {
  std::string path;                           // the file, as named to the reader
  std::map<std::string, ObjectFact> objects;  // every object by absolute path ("/" for the root group)
  const ObjectFact* find(const std::string& object_path) const;
  // The names of the direct children of `group` ("/model"), in byte order (the map's order, HDF5's too).
  std::vector<std::string> children(const std::string& group) const;
};

// Reads the facts of an open file: one walk of every object and attribute, metadata only (collective when the
// file was opened collectively). Throws only when HDF5 cannot read the file's metadata at all.
FileFacts read_facts(hid_t file, const std::string& path);

// Pure. The manifest of a valid file's facts (one walk of the file serves the rules and the load).
CheckpointManifest manifest_of(const FileFacts& facts);

// Pure. Every problem of the facts against FORMAT.md (required objects and attributes, types, R2-R7, R9, R12-R17),
// one line each naming the file, the rule and the object; objects or attributes this reader does not know in a file
// of a newer revision go to `notes` (may be null) instead.
std::vector<std::string> rule_problems(const FileFacts& facts, std::vector<std::string>* notes);

// Whether `text` is valid UTF-8 (R19): no overlong form, no surrogate, nothing above U+10FFFF.
bool valid_utf8(const std::string& text);

// Whether every byte of a bool tensor's `n` bytes is 0 or 1 (R22).
bool bool_bytes_ok(const void* bytes, size_t n);

// Whether `key` is a per-parameter state dataset some optimizer type of docs/FORMAT.md has (momentum_buffer,
// exp_avg, exp_avg_sq, max_exp_avg_sq, step).
bool is_state_key(const std::string& key);

// The values the rules R1, R8, R10 and R11 relate (read with the tensors and counters).
struct FileValues {
  int64_t root_step = 0;  // root attribute step
  Counters counters;
  DataState data;
  std::vector<std::pair<std::string, int64_t>> adam_steps;  // (parameter name, step) of the entries read
};
// The Adam steps among optimizer-state refs ("<param>/step", int64, with data): (parameter name, step).
std::vector<std::pair<std::string, int64_t>> adam_steps(const std::vector<TensorRef>& state);

// Pure. The problems of those values, one line each naming the file, the rule and the dataset.
std::vector<std::string> value_problems(const std::string& path, const FileValues& values);

struct SavePlan;
// The facts the file of a save plan will have (no I/O): save_checkpoint refuses a state whose file would not be
// valid, before it writes anything. `path`: the file's final name (R2).
FileFacts facts_of_plan(const SavePlan& plan, const TrainState& state, int world, const std::string& path);

}  // namespace h5ddp::ckpt

// The part of Python's pickle protocol (2-5) that torch.save'd state dicts and checkpoints use, parsed
// without Python or LibTorch (so it builds alone, for the fuzzer: tests/fuzz/).
//
// Hostile input is expected: every size, count and depth is bounded (PickleLimits), nothing recurses
// over the input, and whatever is wrong throws CheckpointError naming the file. Values live in an arena
// owned by the Pickle, so no destructor recurses either. A container may change only while no other
// container holds it (the Python pickler finishes a container before it nests it), which keeps the
// nesting depth exact and makes cycles (self-referencing objects) an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace h5ddp::interop {

// Bounds on what one data.pkl may build. The defaults are far above any real state dict or checkpoint
// (a 1,000,000-entry dict takes ~2,000,000 objects, ~400 MB) and keep a hostile file to a few GB of
// memory (~3 GB with every limit reached at once) and time linear in its size.
struct PickleLimits {
  uint64_t max_pickle_bytes = uint64_t{1} << 30;    // data.pkl itself
  size_t max_depth = 1000;                          // containers inside containers, and open MARKs
  size_t max_objects = 10'000'000;                  // values created
  size_t max_stack = 10'000'000;                    // values on the unpickling stack at once
  size_t max_items = 20'000'000;                    // items put into lists, tuples and dicts, all together
  size_t max_memo = 10'000'000;                     // memo entries
  uint64_t max_string_bytes = uint64_t{256} << 20;  // one str or bytes object
  size_t max_name_bytes = 1024;                     // "module.name" of a GLOBAL, one INT/PUT/GET line
  size_t max_tensor_dims = 64;
  // Tensors are copied out of their storages. Views that repeat elements (stride 0, as expand() makes) or
  // overlap may make all copies together exceed all storages (which the file holds) by this much.
  uint64_t max_extra_tensor_bytes = uint64_t{1} << 30;
};

struct PyValue;

// A torch.save storage (persistent id ("storage", torch.FloatStorage, key, location, numel)).
struct PickledStorage {
  std::string key;    // the bytes are in the archive's data/<key> record
  std::string type;   // "torch.FloatStorage", ...
  std::string dtype;  // "float32", ... (h5ddp's names)
  size_t element_size = 0;
  int64_t numel = 0;  // >= 0, numel * element_size fits in int64
};

// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...): a view checked to lie inside its
// storage (every index it reaches is < storage numel, with no overflow on the way).
struct PickledTensor {
  const PyValue* storage = nullptr;  // kind kStorage
  int64_t offset = 0;
  std::vector<int64_t> size, stride;
  int64_t numel = 0;
  size_t index = 0;  // position in Pickle::tensors()
};

// One unpickled Python value. Containers point to values in the same Pickle (shared when the pickle's
// memo refers to one value twice).
struct PyValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kStr, kTuple, kList, kDict, kTensor, kGlobal, kStorage };
  PyValue();
  ~PyValue();
  PyValue(const PyValue&) = delete;
  PyValue& operator=(const PyValue&) = delete;

  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                                // kStr (str or bytes); kGlobal: "module.name"
  std::vector<const PyValue*> items;                            // kTuple, kList
  std::vector<std::pair<const PyValue*, const PyValue*>> dict;  // kDict, insertion order
  std::unique_ptr<PickledStorage> storage;                      // kStorage
  std::unique_ptr<PickledTensor> tensor;                        // kTensor

  // Value of the str key `key` in a dict, or nullptr. O(1).
  const PyValue* get(std::string_view key) const;
  // "dict", "tensor", "int", ..., a global's name (for messages).
  std::string type_name() const;

  // Unpickler bookkeeping.
  struct DictIndex;
  std::unique_ptr<DictIndex> index;  // kDict: str and int keys -> position in `dict`
  uint32_t depth = 0;                // containers: 1 + the deepest item's depth
  bool nested = false;               // held by a container: may no longer change
};

// The result of unpickling: the top-level value and the arena that owns every value.
class Pickle {
 public:
  const PyValue& root() const { return *root_; }
  // Every storage and every tensor, in the order the pickle made them.
  const std::vector<const PyValue*>& storages() const { return storages_; }
  const std::vector<const PyValue*>& tensors() const { return tensors_; }

 private:
  friend class Unpickler;
  PyValue& add();
  size_t size() const { return size_; }

  // Values in chunks that never move (pointers into them stay valid), growing 64, 128, ... 16384 values:
  // one allocation per many small objects, where std::deque makes one per three.
  std::vector<std::unique_ptr<PyValue[]>> chunks_;
  size_t chunk_capacity_ = 0, chunk_used_ = 0, size_ = 0;
  const PyValue* root_ = nullptr;
  std::vector<const PyValue*> storages_, tensors_;
};

// `s` fit for a one-line message: control characters as \xNN, cut after `max` bytes with "...". Names
// from a hostile file may hold anything.
std::string printable(std::string_view s, size_t max = 200);

// Local. Unpickles `size` bytes of a data.pkl. `file` names the input in every message ("model.pt").
// Throws CheckpointError for malformed data, opcodes and Python objects outside the supported subset
// (messages name the object), and for any limit exceeded.
Pickle unpickle(const std::string& file, const char* data, size_t size, const PickleLimits& limits = {});

// Local. Checks that each storage's record (data/<key>) exists and holds its numel * element_size bytes;
// `record_size` gives the size of a record by name, nullopt if the archive has none. Throws CheckpointError.
void check_storage_records(const std::string& file, const Pickle& pickle,
                           const std::function<std::optional<uint64_t>(const std::string& record)>& record_size);

}  // namespace h5ddp::interop

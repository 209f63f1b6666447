// libFuzzer target: raw bytes as a torch.save data.pkl (tools/ckpt_torch/pickle.cpp). A finding is any
// exception other than CheckpointError, a sanitizer report (ASan, UBSan, leaks), a run over -timeout or
// -rss_limit_mb, or a broken promise of the parser trapped below (a tensor view outside its storage).
#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "ckpt_torch/pickle.hpp"
#include "h5ddp/error.hpp"

namespace {

using h5ddp::interop::Pickle;
using h5ddp::interop::PyValue;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

// Visits every value once (values are shared: a naive walk of a DAG can take exponential time), without
// recursion, touching what a reader would.
size_t walk(const Pickle& p) {
  std::unordered_set<const PyValue*> seen;
  std::vector<const PyValue*> todo = {&p.root()};
  size_t bytes = 0;
  while (!todo.empty()) {
    const PyValue* v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    bytes += v->type_name().size() + v->s.size();
    for (const PyValue* x : v->items) todo.push_back(x);
    for (const auto& [k, x] : v->dict) {
      todo.push_back(k);
      todo.push_back(x);
    }
    if (v->kind == PyValue::Kind::kDict) bytes += v->get("model") != nullptr;
  }
  return bytes;
}

// pickle.hpp promises: every index a tensor reaches is inside its storage, with no int64 overflow, and
// all tensors together take at most max_extra_tensor_bytes more than all storages.
void check_tensors(const Pickle& p, const h5ddp::interop::PickleLimits& limits) {
  unsigned __int128 storage_bytes = 0, tensor_bytes = 0;
  for (const PyValue* s : p.storages())
    storage_bytes += static_cast<unsigned __int128>(s->storage->numel) * s->storage->element_size;
  for (const PyValue* t : p.tensors()) {
    const auto& info = *t->tensor;
    const auto& st = *info.storage->storage;
    require(info.size.size() == info.stride.size());
    if (info.numel == 0) continue;
    __int128 last = info.offset, numel = 1;
    for (size_t d = 0; d < info.size.size(); ++d) {
      require(info.size[d] > 0 && info.stride[d] >= 0);
      last += static_cast<__int128>(info.size[d] - 1) * info.stride[d];
      numel *= info.size[d];
    }
    require(info.offset >= 0 && last < st.numel && numel == info.numel);
    tensor_bytes += static_cast<unsigned __int128>(info.numel) * st.element_size;
  }
  require(tensor_bytes <= storage_bytes + limits.max_extra_tensor_bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const h5ddp::interop::PickleLimits limits;
  try {
    const Pickle p = h5ddp::interop::unpickle("fuzz.pkl", reinterpret_cast<const char*>(data), size, limits);
    walk(p);
    check_tensors(p, limits);
    // Records of every other storage exist and are large enough.
    bool odd = false;
    h5ddp::interop::check_storage_records("fuzz.pkl", p, [&](const std::string&) -> std::optional<uint64_t> {
      odd = !odd;
      if (odd) return std::nullopt;
      return uint64_t{1} << 20;
    });
  } catch (const h5ddp::CheckpointError&) {
  }
  return 0;
}

#include "h5ddp/comm.hpp"

#include <algorithm>
#include <limits>

#include "h5ddp/error.hpp"

namespace h5ddp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: case DType::kU64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  throw ConfigError("unknown dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kI64: return "int64";
    case DType::kI32: return "int32";
    case DType::kI16: return "int16";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kU64: return "uint64";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kI16,
                  DType::kI8, DType::kU8, DType::kU64, DType::kBool})
    if (name == dtype_name(t)) return t;
  throw ConfigError("unknown dtype name '" + name + "'");
}

bool Comm::agree(uint64_t value) {
  // min(v) == max(v)  <=>  min(v) == v and min(~v) == ~v on every rank; one allreduce of two words.
  uint64_t buf[2] = {value, ~value};
  allreduce(buf, 2, DType::kU64, ReduceOp::kMin);
  return buf[0] == static_cast<uint64_t>(~buf[1]);
}

bool Comm::all_ok(bool local_ok) {
  int32_t v = local_ok ? 1 : 0;
  allreduce(&v, 1, DType::kI32, ReduceOp::kMin);
  return v == 1;
}

void Comm::raise_if_any(const std::string& local_error) {
  int32_t first = local_error.empty() ? std::numeric_limits<int32_t>::max() : rank();
  allreduce(&first, 1, DType::kI32, ReduceOp::kMin);
  if (first == std::numeric_limits<int32_t>::max()) return;
  // The reporting rank's message already names its host and rank when it came from an h5ddp::Error.
  DisagreementError e(Error::Untagged{}, "rank " + std::to_string(first) + " reported: " +
                                             broadcast_string(local_error, first));
  e.mark_agreed();
  throw e;
}

void Comm::require_same(int64_t value, const std::string& what) {
  if (agree(static_cast<uint64_t>(value))) return;
  std::vector<int64_t> all(size());
  allgather(&value, all.data(), 1, DType::kI64);
  std::string seen;
  for (int r = 0; r < size(); ++r) seen += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + "=" + std::to_string(all[r]);
  throw_agreed(DisagreementError("ranks disagree on " + what + ": " + seen));
}

std::string Comm::broadcast_string(const std::string& s, int root) {
  uint64_t n = s.size();
  broadcast(&n, 1, DType::kU64, root);
  std::string out = rank() == root ? s : std::string(n, '\0');
  if (n) broadcast(out.data(), n, DType::kU8, root);
  return out;
}

}  // namespace h5ddp

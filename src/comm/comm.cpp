#include "h5ddp/comm.hpp"

#include <algorithm>
#include <limits>

#include "h5ddp/error.hpp"

namespace h5ddp {

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
  DisagreementError e(Error::Untagged{},
                      "rank " + std::to_string(first) + " reported: " + broadcast_string(local_error, first));
  e.mark_agreed();
  throw e;
}

void Comm::require_same(int64_t value, const std::string& what) {
  if (agree(static_cast<uint64_t>(value))) return;
  std::vector<int64_t> all(size());
  allgather(&value, all.data(), 1, DType::kI64);
  std::string seen;
  for (int r = 0; r < size(); ++r)
    seen += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + "=" + std::to_string(all[r]);
  throw_agreed(DisagreementError("ranks disagree on " + what + ": " + seen));
}

std::unique_ptr<Work> Comm::reduce_scatter_async(void* buf, const std::vector<size_t>& counts, DType dtype,
                                                 ReduceOp op) {
  H5DDP_CHECK(counts.size() == static_cast<size_t>(size()),
              "reduce_scatter_async: counts must have one entry per rank");
  size_t total = 0;
  for (size_t c : counts) total += c;
  return allreduce_async(buf, total, dtype, op);
}

void Comm::allgatherv(void* buf, const std::vector<size_t>& counts, DType dtype) {
  H5DDP_CHECK(counts.size() == static_cast<size_t>(size()), "allgatherv: counts must have one entry per rank");
  auto* p = static_cast<char*>(buf);
  for (int r = 0; r < size(); ++r) {
    if (counts[r] > 0) broadcast(p, counts[r], dtype, r);
    p += counts[r] * dtype_size(dtype);
  }
}

std::string Comm::broadcast_string(const std::string& s, int root) {
  uint64_t n = s.size();
  broadcast(&n, 1, DType::kU64, root);
  std::string out = rank() == root ? s : std::string(n, '\0');
  if (n) broadcast(out.data(), n, DType::kU8, root);
  return out;
}

}  // namespace h5ddp

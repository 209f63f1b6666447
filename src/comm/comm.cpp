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
  // The reporting rank's message already names its host and rank when it came from an h5ddp::Error.
  rethrow_first(local_error.empty()
                    ? nullptr
                    : std::make_exception_ptr(DisagreementError(
                          Error::Untagged{}, "rank " + std::to_string(rank()) + " reported: " + local_error)));
}

namespace {

// The h5ddp::Error kinds an agreed error keeps across ranks (most derived first).
enum class ErrorKind : int32_t { kError, kConfig, kData, kCheckpointMismatch, kCheckpoint, kDisagreement, kH5, kMpi };

ErrorKind kind_of(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e)) return ErrorKind::kConfig;
  if (dynamic_cast<const DataError*>(&e)) return ErrorKind::kData;
  if (dynamic_cast<const CheckpointMismatchError*>(&e)) return ErrorKind::kCheckpointMismatch;
  if (dynamic_cast<const CheckpointError*>(&e)) return ErrorKind::kCheckpoint;
  if (dynamic_cast<const DisagreementError*>(&e)) return ErrorKind::kDisagreement;
  if (dynamic_cast<const H5Error*>(&e)) return ErrorKind::kH5;
  if (dynamic_cast<const MpiError*>(&e)) return ErrorKind::kMpi;
  return ErrorKind::kError;
}

template <class E>
[[noreturn]] void throw_agreed_untagged(const std::string& message) {
  throw_agreed(E(Error::Untagged{}, message));
}

[[noreturn]] void throw_kind(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kConfig:
      throw_agreed_untagged<ConfigError>(message);
    case ErrorKind::kData:
      throw_agreed_untagged<DataError>(message);
    case ErrorKind::kCheckpointMismatch:
      throw_agreed_untagged<CheckpointMismatchError>(message);
    case ErrorKind::kCheckpoint:
      throw_agreed_untagged<CheckpointError>(message);
    case ErrorKind::kDisagreement:
      throw_agreed_untagged<DisagreementError>(message);
    case ErrorKind::kH5:
      throw_agreed_untagged<H5Error>(message);
    case ErrorKind::kMpi:
      throw_agreed_untagged<MpiError>(message);
    case ErrorKind::kError:
      break;
  }
  throw_agreed_untagged<Error>(message);
}

}  // namespace

void Comm::rethrow_first(const std::exception_ptr& error) {
  int32_t first = error ? rank() : std::numeric_limits<int32_t>::max();
  allreduce(&first, 1, DType::kI32, ReduceOp::kMin);
  if (first == std::numeric_limits<int32_t>::max()) return;
  int32_t kind = 0;
  std::string message;
  if (first == rank()) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {  // its message already names its host and rank
      kind = static_cast<int32_t>(kind_of(e));
      message = e.what();
    } catch (const std::exception& e) {
      message = process_tag() + " " + e.what();
    } catch (...) {
      message = process_tag() + " unknown exception";
    }
  }
  broadcast(&kind, 1, DType::kI32, first);
  throw_kind(static_cast<ErrorKind>(kind), broadcast_string(message, first));
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

namespace {
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};
}  // namespace

std::unique_ptr<Work> Comm::allgatherv_async(void* buf, const std::vector<size_t>& counts, DType dtype) {
  allgatherv(buf, counts, dtype);
  return std::make_unique<CompletedWork>();
}

std::string Comm::broadcast_string(const std::string& s, int root) {
  uint64_t n = s.size();
  broadcast(&n, 1, DType::kU64, root);
  std::string out = rank() == root ? s : std::string(n, '\0');
  if (n) broadcast(out.data(), n, DType::kU8, root);
  return out;
}

}  // namespace h5ddp

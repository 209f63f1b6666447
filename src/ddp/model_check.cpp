// The model check and the initial broadcast of the wrappers (DataParallel), apart from the reducer.
#include <map>
#include <sstream>

#include "ddp/broadcast.hpp"
#include "h5ddp/data_parallel.hpp"
#include "h5ddp/error.hpp"

namespace h5ddp {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

// Broadcasts tensors from `root` through `comm`, coalesced into flat buffers of at most `chunk_bytes` per
// dtype and device, so a model with hundreds of small tensors costs a few broadcasts. Collective.
void broadcast_coalesced(Comm& host, Comm* device, const std::vector<torch::Tensor>& tensors, int root,
                         size_t chunk_bytes) {
  torch::NoGradGuard no_grad;
  std::map<std::pair<int, std::string>, std::vector<torch::Tensor>> groups;  // ordered: same on all ranks
  for (const auto& t : tensors) groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  for (auto& [key, group] : groups) {
    Comm& comm = group.front().is_cuda() ? *device : host;
    size_t i = 0;
    while (i < group.size()) {
      size_t j = i, bytes = 0;
      while (j < group.size() && (j == i || bytes + group[j].nbytes() <= chunk_bytes)) bytes += group[j++].nbytes();
      std::vector<torch::Tensor> flat_parts;
      for (size_t k = i; k < j; ++k) flat_parts.push_back(group[k].reshape(-1));
      torch::Tensor flat = torch::cat(flat_parts).contiguous();
      comm.broadcast(flat.data_ptr(), static_cast<size_t>(flat.numel()), *dtype_of(flat.scalar_type()), root);
      int64_t off = 0;
      for (size_t k = i; k < j; ++k) {
        const int64_t n = group[k].numel();
        group[k].copy_(flat.narrow(0, off, n).view(group[k].sizes()));
        off += n;
      }
      i = j;
    }
  }
}

void DataParallel::check_same_model(const std::string& problem, const std::string& options_line) {
  std::string local_error = problem;
  bool has_cuda = false;
  for (const auto& p : params_) has_cuda = has_cuda || p.is_cuda();
  for (const auto& b : buffers_) has_cuda = has_cuda || b.is_cuda();
  if (has_cuda && options_.device_comm == nullptr)
    local_error = kind_ + ": the module has CUDA tensors but DdpOptions::device_comm (an NcclComm) is not set";
  if (options_.device_comm && options_.device_comm->size() != comm_.size())
    local_error = kind_ + ": device_comm has " + std::to_string(options_.device_comm->size()) + " ranks, comm has " +
                  std::to_string(comm_.size());
  for (const auto& p : params_) {
    if (!p.is_cuda() && !p.device().is_cpu()) local_error = kind_ + ": unsupported device " + p.device().str();
    if (p.is_sparse()) local_error = kind_ + ": sparse parameters are not supported";
  }
  comm_.raise_if_any(local_error);  // local problems first (agreed: every rank throws together)
  const std::vector<std::string> entries = model_signature(options_line);
  std::string joined;
  for (const auto& e : entries) joined += e + "\n";
  if (comm_.agree(fnv1a(joined))) return;
  raise_model_difference(entries, joined);
}

// Options, then each parameter and buffer as "kind name dtype[shape]".
std::vector<std::string> DataParallel::model_signature(const std::string& options_line) const {
  std::vector<std::string> entries;
  entries.push_back("options first_bucket_bytes=" + std::to_string(options_.first_bucket_bytes) +
                    " bucket_cap_bytes=" + std::to_string(options_.bucket_cap_bytes) +
                    " broadcast_buffers=" + std::to_string(options_.broadcast_buffers) +
                    " find_unused_parameters=" + std::to_string(options_.find_unused_parameters) + " " + options_line);
  for (size_t i = 0; i < params_.size(); ++i) {
    std::ostringstream s;
    s << "parameter '" << param_names_[i] << "' " << dtype_name(to_dtype(params_[i].scalar_type()))
      << params_[i].sizes() << " on " << (params_[i].is_cuda() ? "cuda" : "cpu");
    for (const auto& a : param_aliases_[i]) s << " also '" << a << "'";
    entries.push_back(s.str());
  }
  for (const auto& item : module_->named_buffers(true)) {
    std::ostringstream s;
    s << "buffer '" << item.key() << "' " << dtype_name(to_dtype(item.value().scalar_type())) << item.value().sizes();
    entries.push_back(s.str());
  }
  for (const auto& item : module_->named_parameters(true))
    if (!item.value().requires_grad()) entries.push_back("frozen parameter '" + item.key() + "'");
  return entries;
}

void DataParallel::raise_model_difference(const std::vector<std::string>& entries, const std::string& joined) {
  // Disagreement: every rank compares with rank 0's signature and says what differs first.
  const std::string root_sig = comm_.broadcast_string(joined, 0);
  std::vector<std::string> root_entries;
  {
    std::istringstream in(root_sig);
    for (std::string line; std::getline(in, line);) root_entries.push_back(line);
  }
  std::string diff;
  if (root_sig != joined) {
    size_t k = 0;
    while (k < entries.size() && k < root_entries.size() && entries[k] == root_entries[k]) ++k;
    const std::string mine = k < entries.size() ? entries[k] : "nothing more";
    const std::string theirs = k < root_entries.size() ? root_entries[k] : "nothing more";
    diff = "entry " + std::to_string(k) + ": rank " + std::to_string(comm_.rank()) + " has " + mine + ", rank 0 has " +
           theirs;
  }
  const int32_t differs = diff.empty() ? 0 : 1;
  std::vector<int32_t> flags(comm_.size());
  comm_.allgather(&differs, flags.data(), 1, DType::kI32);
  std::string ranks;
  int first = -1;
  for (int r = 0; r < comm_.size(); ++r)
    if (flags[r]) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      if (first < 0) first = r;
    }
  const std::string detail = comm_.broadcast_string(diff, first < 0 ? 0 : first);
  throw_agreed(DisagreementError(kind_ + ": ranks built different models (rank " + ranks +
                                 " differ from rank 0); first difference on rank " + std::to_string(first) + ": " +
                                 detail));
}

}  // namespace h5ddp

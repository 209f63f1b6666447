#include "safetensors.hpp"

#include <cstring>
#include <set>

#include "h5ddp/error.hpp"
#include "train/metrics.hpp"  // json_quote

namespace h5ddp::interop {

std::string safetensors_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat64:
      return "F64";
    case torch::kFloat32:
      return "F32";
    case torch::kFloat16:
      return "F16";
    case torch::kBFloat16:
      return "BF16";
    case torch::kInt64:
      return "I64";
    case torch::kInt32:
      return "I32";
    case torch::kInt16:
      return "I16";
    case torch::kInt8:
      return "I8";
    case torch::kUInt8:
      return "U8";
    case torch::kBool:
      return "BOOL";
    default:
      return "";
  }
}

std::vector<char> safetensors_bytes(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header += (first ? "" : ",") + json_quote(k) + ":" + json_quote(v);
      first = false;
    }
    header += "}";
  }
  std::set<std::string> names;
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string dtype = safetensors_dtype(tensor.scalar_type());
    if (dtype.empty())
      throw CheckpointError("safetensors has no dtype for tensor '" + name + "' (" +
                            std::string(c10::toString(tensor.scalar_type())) + ")");
    if (name == "__metadata__" || !names.insert(name).second)
      throw CheckpointError("safetensors: tensor name '" + name + "' is reserved or given twice");
    const torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    std::string shape;
    for (int64_t d : t.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += std::string(header.size() > 1 ? "," : "") + json_quote(name) + ":{\"dtype\":\"" + dtype +
              "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
    data.push_back(t);
  }
  header += "}";
  while ((8 + header.size()) % 8 != 0) header += ' ';  // the data starts 8-byte aligned
  std::vector<char> out(8 + header.size() + offset);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);  // little-endian u64
  std::memcpy(out.data() + 8, header.data(), header.size());
  char* at = out.data() + 8 + header.size();
  for (const torch::Tensor& t : data) {
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    if (bytes > 0) std::memcpy(at, t.data_ptr(), bytes);  // x86/ARM hosts are little-endian, as the format
    at += bytes;
  }
  return out;
}

}  // namespace h5ddp::interop

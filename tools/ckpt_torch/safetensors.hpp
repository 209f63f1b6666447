// The safetensors format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
// header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the tensors' bytes, row-major and little-endian, back to back with
// no gaps, offsets counted from the end of the header. What h5ddp-ckpt export --format safetensors writes.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace h5ddp::interop {

// The file's bytes for `tensors` (in this order; names unique) and `metadata`. The header is padded with
// spaces so the data starts at a multiple of 8 bytes. Throws CheckpointError for a dtype safetensors has no
// name for, or a name given twice.
std::vector<char> safetensors_bytes(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata);

// The format's dtype name ("F32", "BF16", "I64", ...) of `t`; empty when it has none.
std::string safetensors_dtype(torch::ScalarType t);

}  // namespace h5ddp::interop

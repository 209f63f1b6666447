// The element types h5ddp moves and stores: communicators (Comm), checkpoints (TensorRef, the file's
// `dtype` attribute) and the LibTorch binding all speak this one enum. No dependencies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace h5ddp {

enum class DType : uint8_t { kF32, kF64, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kU64, kBool };

size_t dtype_size(DType t);
// Stable lowercase names used in files and messages: "float32", "int64", ...
const char* dtype_name(DType t);
// Inverse of dtype_name; throws ConfigError on an unknown name.
DType dtype_from_name(const std::string& name);

}  // namespace h5ddp

#include "h5ddp/dtype.hpp"

#include "h5ddp/error.hpp"

namespace h5ddp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
    case DType::kU64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  throw ConfigError("unknown dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kI64:
      return "int64";
    case DType::kI32:
      return "int32";
    case DType::kI16:
      return "int16";
    case DType::kI8:
      return "int8";
    case DType::kU8:
      return "uint8";
    case DType::kU64:
      return "uint64";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kI16,
                  DType::kI8, DType::kU8, DType::kU64, DType::kBool})
    if (name == dtype_name(t)) return t;
  throw ConfigError("unknown dtype name '" + name + "'");
}

}  // namespace h5ddp

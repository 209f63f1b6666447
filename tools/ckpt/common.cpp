#include <cstdio>
#include <cstring>

#include "ckpt/subcommands.hpp"

namespace h5ddp::ckpt_tool {

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

namespace {
float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: renormalise
    int e = -1;
    uint32_t m = mant;
    do {
      ++e;
      m <<= 1;
    } while (!(m & 0x400u));
    bits = sign | ((112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
template <class T>
double load(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return static_cast<double>(v);
}
}  // namespace

double element_as_double(const uint8_t* p, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32:
      return load<float>(p, i);
    case DType::kF64:
      return load<double>(p, i);
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return half_to_float(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kI64:
      return load<int64_t>(p, i);
    case DType::kI32:
      return load<int32_t>(p, i);
    case DType::kI16:
      return load<int16_t>(p, i);
    case DType::kI8:
      return load<int8_t>(p, i);
    case DType::kU8:
    case DType::kBool:
      return load<uint8_t>(p, i);
    case DType::kU64:
      return load<uint64_t>(p, i);
  }
  return 0;
}

}  // namespace h5ddp::ckpt_tool

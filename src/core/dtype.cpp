#include "trl/core/dtype.h"

#include <cmath>

namespace trl {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F64: return 8;
  }
  return 0;
}

bool dtype_is_float(DType dtype) { return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F64; }

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F64: return "f64";
  }
  return "?";
}

std::string_view dtype_safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::F64: return "F64";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  if (name == "F32") return DType::F32;
  if (name == "BF16") return DType::BF16;
  if (name == "F16") return DType::F16;
  if (name == "I32") return DType::I32;
  if (name == "I64") return DType::I64;
  if (name == "F64") return DType::F64;
  return std::nullopt;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "float" || name == "F32") return DType::F32;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::BF16;
  if (name == "f16" || name == "float16" || name == "half" || name == "F16") return DType::F16;
  if (name == "i32" || name == "int32" || name == "I32") return DType::I32;
  if (name == "i64" || name == "int64" || name == "I64") return DType::I64;
  if (name == "f64" || name == "float64" || name == "double" || name == "F64") return DType::F64;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;  // +-0
    } else {        // subnormal: normalise into an f32 normal
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mantissa & 0x3ffu) << 13;
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | mantissa << 13;  // Inf or NaN (payload kept)
  } else {
    bits = sign | (exponent + (127 - 15)) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {
    // f16 subnormal or zero: value = m * 2^-24. Compute with exact float arithmetic: abs < 2^-14,
    // so abs * 2^24 < 2^10 and nearbyint (ties to even in the default mode) gives the mantissa.
    float a;
    std::memcpy(&a, &abs, sizeof a);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f)));
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t rebiased = abs - (static_cast<uint32_t>(127 - 15) << 23);
  uint32_t rounded = rebiased + 0xfffu + ((rebiased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

}  // namespace trl

// Element types and the conversions between them.
//
// bf16 is the upper half of an IEEE f32. f32 -> bf16 rounds to nearest, ties to even, and keeps NaN a
// (quiet) NaN and +-Inf infinite; bf16 -> f32 is exact. f16 is IEEE binary16: read from checkpoints and
// converted exactly to f32; f32 -> f16 also rounds to nearest even (overflow gives Inf).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace trl {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, F64 };

size_t dtype_size(DType dtype);
bool dtype_is_float(DType dtype);
// Our short name: "f32", "bf16", "f16", "i32", "i64", "f64" (f64: the oracle's precision for gradient checks).
std::string_view dtype_name(DType dtype);
// The safetensors header name: "F32", "BF16", "F16", "I32", "I64".
std::string_view dtype_safetensors_name(DType dtype);
std::optional<DType> dtype_from_safetensors_name(std::string_view name);
// Accepts our names and the usual aliases: f32/float32/float, bf16/bfloat16, f16/float16/half, i32/int32, i64/int64.
std::optional<DType> dtype_from_name(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the sign, force a quiet NaN
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even; Inf stays Inf, and values that round past the largest finite bf16 become Inf.
  uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Round an f32 through bf16 and back (what storing an activation in bf16 does to it).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

}  // namespace trl

#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "trl/core/dtype.h"
#include "trl/core/tensor.h"

namespace trl {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(BF16, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 3.0e38f, 1.0e-38f}) {
    float r = round_bf16(f);
    if ((bits(f) & 0xffffu) == 0) {
      EXPECT_EQ(bits(r), bits(f)) << f;
    }
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
}

TEST(BF16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 (even mantissa) and 1 + 2^-7: ties go to even -> 1.0
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even) -> up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);
  // just above halfway rounds up, just below rounds down
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);
  // negative values round symmetrically
  EXPECT_EQ(f32_to_bf16(from_bits(0xbf808001u)), 0xbf81);
}

TEST(BF16, InfNanAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_bf16(inf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80);
  EXPECT_TRUE(std::isinf(bf16_to_f32(0x7f80)));
  // NaN stays NaN, including NaNs whose payload sits only in the low 16 bits (naive truncation would give Inf).
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::signbit(bf16_to_f32(f32_to_bf16(from_bits(0xff800001u)))));
  // The largest f32 rounds past the largest finite bf16 -> Inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  // The largest finite bf16 survives
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f0000u)), 0x7f7f);
}

TEST(BF16, MatchesDoubleRoundingOnManyValues) {
  // Against an independent formulation: pick the nearer of the two bf16 neighbours, ties to even.
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    uint32_t b = state;
    if (((b >> 23) & 0xffu) == 0xffu) continue;  // skip Inf/NaN
    float f = from_bits(b);
    uint32_t lo = b & 0xffff0000u;
    double dlo = from_bits(lo), dhi = from_bits(lo + 0x10000u);
    if (((lo + 0x10000u) >> 23 & 0xffu) == 0xffu) continue;
    double d = f;
    double elo = std::fabs(d - dlo), ehi = std::fabs(dhi - d);
    uint16_t expect = static_cast<uint16_t>((elo < ehi || (elo == ehi && ((lo >> 16) & 1u) == 0)) ? lo >> 16 : (lo + 0x10000u) >> 16);
    ASSERT_EQ(f32_to_bf16(f), expect) << std::hex << b;
  }
}

TEST(F16, ConvertsExactly) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  // Every finite f16 survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7c00u) == 0x7c00u) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);   // rounds up to Inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);   // rounds down to max
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
}

TEST(DType, Names) {
  EXPECT_EQ(dtype_from_safetensors_name("BF16"), DType::BF16);
  EXPECT_FALSE(dtype_from_safetensors_name("F8_E4M3").has_value());
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::BF16);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
}

TEST(Tensor, OwnedViewReshapeConvert) {
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::from_f32(v, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.storage_kind(), StorageKind::Owned);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  Tensor r = t.reshape({3, 2});
  EXPECT_EQ(r.data(), t.data());  // shares storage
  EXPECT_THROW(t.reshape({4, 2}), std::exception);
  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.nbytes(), 12u);
  EXPECT_EQ(b.to_f32_vector(), v);
  Tensor view = Tensor::view(v.data(), DType::F32, {6}, nullptr);
  EXPECT_EQ(view.storage_kind(), StorageKind::View);
  EXPECT_EQ(view.to_f32_vector(), v);
  EXPECT_THROW(Tensor::zeros(DType::F32, {-1, 2}), std::exception);
}

}  // namespace
}  // namespace trl

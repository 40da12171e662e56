// Scalar math the vector kernels inline (vec.cpp, vec_distill.cpp): branch-free polynomial exp and log written so
// that GCC vectorises the loops that call them.
#pragma once

#include <cstdint>

namespace trl::cpu::vec {

// e^v, written so that loops over it vectorise: range reduction v = k·ln2 + r with |r| <= ln2/2, a degree-6
// polynomial for e^r (relative error < 2e-7) and 2^k built in the exponent bits. -inf (a masked score) and
// anything below -87 give exactly 0. Used for v <= 0 (values minus their row maximum).
__attribute__((always_inline)) inline float exp_nonpositive(float v) {
  const float vc = v < -87.0f ? -87.0f : v;
  const float kf = __builtin_floorf(vc * 1.44269504f + 0.5f);
  const float r = (vc - kf * 0.693145751953125f) - kf * 1.428606765330187e-06f;
  const float poly = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666679f + r * (0.00833333377f + r * 0.00138888892f)))));
  const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return v < -87.0f ? 0.0f : poly * scale;
}
// log x for x > 0 (x below the smallest normal is read as it), written so that loops over it vectorise: x = 2^e·m
// with m in [√½, √2), log m = 2·atanh(s), s = (m − 1)/(m + 1), |s| <= 0.172, by its odd series to s^9 (relative
// error < 1e-7).
__attribute__((always_inline)) inline float log_positive(float x) {
  const float xc = x < 1.17549435e-38f ? 1.17549435e-38f : x;
  int32_t bits;
  __builtin_memcpy(&bits, &xc, 4);
  int32_t e = ((bits >> 23) & 0xff) - 127;
  const int32_t mbits = (bits & 0x7fffff) | 0x3f800000;
  float m;
  __builtin_memcpy(&m, &mbits, 4);
  const bool big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e += big ? 1 : 0;
  const float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  const float lm = 2.0f * s * (1.0f + s2 * (0.333333343f + s2 * (0.2f + s2 * (0.142857149f + s2 * 0.111111112f))));
  const float ef = static_cast<float>(e);
  return ef * 0.693145751953125f + (ef * 1.428606765330187e-06f + lm);
}

}  // namespace trl::cpu::vec

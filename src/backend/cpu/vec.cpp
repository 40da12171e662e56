// Vector kernels of the CPU backend: the hot inner loops (reductions GCC will not vectorise on its own), each
// compiled for AVX-512, AVX2 and the x86-64 baseline; the loader picks one at run time (GCC target_clones), so the
// binary runs anywhere and never needs -march=native. The AVX512-BF16 dot products are separate functions that
// callers select when cpu_features().avx512bf16 says so. Every function works on one row (n or K elements) and is
// callable on its own (tests/backend/op_table_test.cpp, dev micro-benchmarks).
#include "backend/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/vec_math.h"
#include "core/cpu_features.h"
#include "trl/core/dtype.h"
#include "core/sanitizers.h"

namespace trl::cpu::vec {

#if defined(__x86_64__) && !TRL_ASAN
#define TRL_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TRL_MULTIVERSION
#endif
TRL_MULTIVERSION float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += a[i + k] * b[i + k];
  float s = 0;
  for (int k = 0; k < 16; ++k) s += acc[k];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
// The f32 bits of x rounded to bf16 (nearest even; NaN stays a quiet NaN): branch-free, so loops vectorise.
__attribute__((always_inline)) inline uint32_t bf16_rounded_bits(float x) {
  uint32_t b;
  __builtin_memcpy(&b, &x, 4);
  const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
  const uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  return nan ? (b | 0x00400000u) & 0xffff0000u : r;
}
__attribute__((always_inline)) inline float bf16_round(float x) {
  const uint32_t b = bf16_rounded_bits(x);
  float f;
  __builtin_memcpy(&f, &b, 4);
  return f;
}
// Attention's scores for one query row, before the softmax: x ← scale·x with the rounding of the model dtype
// (bf16: round(round(x)·scale), as eager Transformers stores bf16 scores), -inf where the key's segment id differs
// from `seg` (key_seg null: no mask); returns the row's maximum.
TRL_MULTIVERSION float attention_scores(float* x, int64_t n, float scale, bool bf16, const int32_t* key_seg, int32_t seg) {
  float acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = -INFINITY;
  int64_t i = 0;
  auto one = [&](int64_t j) {
    float v = bf16 ? bf16_round(bf16_round(x[j]) * scale) : x[j] * scale;
    if (key_seg && key_seg[j] != seg) v = -INFINITY;
    x[j] = v;
    return v;
  };
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) {
      const float v = one(i + k);
      acc[k] = v > acc[k] ? v : acc[k];
    }
  float mx = -INFINITY;
  for (int k = 0; k < 16; ++k) mx = acc[k] > mx ? acc[k] : mx;
  for (; i < n; ++i) {
    const float v = one(i);
    mx = v > mx ? v : mx;
  }
  return mx;
}
// x ← x·inv (rounded to bf16 when bf16), and its bf16 bits into out16 when given: the softmax's normalisation.
TRL_MULTIVERSION void scale_round(float* x, int64_t n, float inv, bool bf16, uint16_t* out16) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = bf16 ? bf16_round(x[i] * inv) : x[i] * inv;
    x[i] = v;
    if (out16) out16[i] = static_cast<uint16_t>(bf16_rounded_bits(v) >> 16);
  }
}
// The softmax backward of one row: d ← p∘(d − p·d)·scale, and its bf16 bits into out16 when given.
TRL_MULTIVERSION void softmax_backward_row(const float* p, float* d, int64_t n, float scale, uint16_t* out16) {
  const float pdp = dot(p, d, n);
  for (int64_t j = 0; j < n; ++j) {
    d[j] = p[j] * (d[j] - pdp) * scale;
    if (out16) out16[j] = static_cast<uint16_t>(bf16_rounded_bits(d[j]) >> 16);
  }
}
// The upper 16 bits of each f32 (exactly its bf16 value when x is already rounded to bf16).
TRL_MULTIVERSION void bf16_bits(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    __builtin_memcpy(&b, x + i, 4);
    out[i] = static_cast<uint16_t>(b >> 16);
  }
}
// The exponentials of the softmaxes (attention rows, vocabulary chunks): x ← e^(x − shift), with Σ e and, for the
// entropy, Σ e·(x − shift) in the same pass. GCC does not vectorise the generic loops (the clamps and the masked
// sum are control flow to it), so CPUs with AVX-512 take the explicit version below; same polynomial, with fused
// multiply-adds, and masked loads and stores for the tail. Measured: docs/PERFORMANCE.md.
template <bool kSum, bool kEy>
__attribute__((always_inline)) inline float exp_shift_generic(float* x, int64_t n, float shift, float* ey) {
  float acc[16] = {}, acc2[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) {
      const float v = x[i + k] - shift, e = exp_nonpositive(v);
      x[i + k] = e;
      acc[k] += e;
      if (kEy) acc2[k] += e > 0.0f ? e * v : 0.0f;  // e = 0 where v = -inf (a masked logit): no 0·inf
    }
  float s = 0, s2 = 0;
  for (int k = 0; k < 16; ++k) s += acc[k], s2 += acc2[k];
  for (; i < n; ++i) {
    const float v = x[i] - shift, e = exp_nonpositive(v);
    x[i] = e;
    s += e;
    if (kEy) s2 += e > 0.0f ? e * v : 0.0f;
  }
  if (kEy) *ey = s2;
  return kSum ? s : 0.0f;
}
TRL_MULTIVERSION void exp_shift_any(float* x, int64_t n, float shift) { exp_shift_generic<false, false>(x, n, shift, nullptr); }
TRL_MULTIVERSION float exp_shift_sum_any(float* x, int64_t n, float shift) { return exp_shift_generic<true, false>(x, n, shift, nullptr); }
TRL_MULTIVERSION float exp_shift_sum_ey_any(float* x, int64_t n, float shift, float* ey) { return exp_shift_generic<true, true>(x, n, shift, ey); }

#if defined(__x86_64__)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, falsely, inside the AVX-512 intrinsics
#endif
// exp_nonpositive on 16 lanes: v = k·ln2 + r, k = floor(v·log2e + ½), e^r by the same degree-6 polynomial, 2^k in
// the exponent bits; v < −87 (and −inf) gives 0, a NaN stays NaN.
__attribute__((target("avx512f"), always_inline)) inline __m512 exp_nonpositive16(__m512 v) {
  const __m512 vc = _mm512_max_ps(_mm512_set1_ps(-87.0f), v);  // (max returns its second operand for a NaN)
  const __m512 kf = _mm512_roundscale_ps(_mm512_fmadd_ps(vc, _mm512_set1_ps(1.44269504f), _mm512_set1_ps(0.5f)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(1.428606765330187e-06f), _mm512_fnmadd_ps(kf, _mm512_set1_ps(0.693145751953125f), vc));
  __m512 p = _mm512_set1_ps(0.00138888892f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.00833333377f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.0416666679f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.166666672f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(kf), _mm512_set1_epi32(127)), 23);
  const __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.0f), _CMP_LT_OQ), _mm512_setzero_ps());
}
template <bool kSum, bool kEy>
__attribute__((target("avx512f"))) float exp_shift_avx512(float* x, int64_t n, float shift, float* ey) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 v = _mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + i), sh);
    const __m512 e = exp_nonpositive16(v);
    _mm512_mask_storeu_ps(x + i, lanes, e);
    if (kSum) acc = _mm512_mask_add_ps(acc, lanes, acc, e);
    if (kEy) acc2 = _mm512_mask_add_ps(acc2, _mm512_mask_cmp_ps_mask(lanes, e, _mm512_setzero_ps(), _CMP_GT_OQ), acc2, _mm512_mul_ps(e, v));
  }
  alignas(64) float lanes[2][16];  // (not _mm512_reduce_add_ps: GCC 12 warns falsely inside it)
  _mm512_store_ps(lanes[0], acc);
  _mm512_store_ps(lanes[1], acc2);
  float s = 0, s2 = 0;
  for (int k = 0; k < 16; ++k) s += lanes[0][k], s2 += lanes[1][k];
  if (kEy) *ey = s2;
  return kSum ? s : 0.0f;
}
// 16 bf16 values widened to f32, and f32 rounded to bf16 (nearest even; a NaN keeps its sign and turns quiet).
__attribute__((target("avx512f"), always_inline)) inline __m512 load_bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
__attribute__((target("avx512f"), always_inline)) inline __m512i round_bf16x16_bits(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(bits, _mm512_set1_epi32(0x00400000)));
}
__attribute__((target("avx512f"), always_inline)) inline __m512 round_bf16x16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(round_bf16x16_bits(x), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
__attribute__((target("avx512f"), always_inline)) inline void store_bf16x16(uint16_t* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bf16x16_bits(x), 16)));
}
// σ(g) from t = e^(−|g|) <= 1 (no overflow): 1/(1 + t) for g >= 0, t/(1 + t) below.
__attribute__((target("avx512f"), always_inline)) inline __m512 sigmoid16(__m512 g) {
  const __m512 t = exp_nonpositive16(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(g), _mm512_set1_epi32(static_cast<int>(0x80000000u)))));
  const __m512 num = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ), t);
  return _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), t));
}
__attribute__((target("avx512f"))) void swiglu_bf16_avx512(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = load_bf16x16(g + i);
    store_bf16x16(out + i, _mm512_mul_ps(round_bf16x16(_mm512_mul_ps(gv, sigmoid16(gv))), load_bf16x16(u + i)));
  }
  if (i < n) {  // the tail through the same lanes (padded copies), so an element's bits never depend on the length
    alignas(64) uint16_t gt[16] = {}, ut[16] = {}, ot[16];
    std::memcpy(gt, g + i, static_cast<size_t>(n - i) * 2);
    std::memcpy(ut, u + i, static_cast<size_t>(n - i) * 2);
    swiglu_bf16_avx512(gt, ut, 16, ot);
    std::memcpy(out + i, ot, static_cast<size_t>(n - i) * 2);
  }
}
__attribute__((target("avx512f"))) void swiglu_backward_bf16_avx512(const uint16_t* g, const uint16_t* u, const uint16_t* dy, int64_t n, uint16_t* dg,
                                                                    uint16_t* du) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = load_bf16x16(g + i), uv = load_bf16x16(u + i), d = load_bf16x16(dy + i), sig = sigmoid16(gv);
    const __m512 dsilu = _mm512_mul_ps(sig, _mm512_add_ps(one, _mm512_mul_ps(gv, _mm512_sub_ps(one, sig))));
    store_bf16x16(dg + i, _mm512_mul_ps(_mm512_mul_ps(d, uv), dsilu));
    store_bf16x16(du + i, _mm512_mul_ps(_mm512_mul_ps(d, gv), sig));
  }
  if (i < n) {  // the tail through the same lanes, as in swiglu_bf16_avx512
    alignas(64) uint16_t gt[16] = {}, ut[16] = {}, dt[16] = {}, dgt[16], dut[16];
    std::memcpy(gt, g + i, static_cast<size_t>(n - i) * 2);
    std::memcpy(ut, u + i, static_cast<size_t>(n - i) * 2);
    std::memcpy(dt, dy + i, static_cast<size_t>(n - i) * 2);
    swiglu_backward_bf16_avx512(gt, ut, dt, 16, dgt, dut);
    std::memcpy(dg + i, dgt, static_cast<size_t>(n - i) * 2);
    std::memcpy(du + i, dut, static_cast<size_t>(n - i) * 2);
  }
}
#pragma GCC diagnostic pop

// The same kernels on 8 lanes for CPUs with AVX2 and FMA but no AVX-512: the same polynomial with the same fused
// multiply-adds, so each lane's bits equal the AVX-512 kernels' (tests/backend/vec_test.cpp); tails go through the
// same lanes as padded copies.
#define TRL_AVX2 __attribute__((target("avx2,fma")))
TRL_AVX2 __attribute__((always_inline)) inline __m256 exp_nonpositive8(__m256 v) {
  const __m256 vc = _mm256_max_ps(_mm256_set1_ps(-87.0f), v);  // (max returns its second operand for a NaN)
  const __m256 kf = _mm256_floor_ps(_mm256_fmadd_ps(vc, _mm256_set1_ps(1.44269504f), _mm256_set1_ps(0.5f)));
  const __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(1.428606765330187e-06f), _mm256_fnmadd_ps(kf, _mm256_set1_ps(0.693145751953125f), vc));
  __m256 p = _mm256_set1_ps(0.00138888892f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.00833333377f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.0416666679f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.166666672f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(kf), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  return _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(v, _mm256_set1_ps(-87.0f), _CMP_LT_OQ));
}
TRL_AVX2 inline float hsum8(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float s = 0;
  for (int k = 0; k < 8; ++k) s += lanes[k];
  return s;
}
// 8 elements in place: e^(x − shift), added to the sums.
template <bool kSum, bool kEy>
TRL_AVX2 __attribute__((always_inline)) inline void exp_lanes8(float* p, __m256 sh, __m256& acc, __m256& acc2) {
  const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(p), sh);
  const __m256 e = exp_nonpositive8(v);
  _mm256_storeu_ps(p, e);
  if (kSum) acc = _mm256_add_ps(acc, e);
  if (kEy) acc2 = _mm256_add_ps(acc2, _mm256_and_ps(_mm256_cmp_ps(e, _mm256_setzero_ps(), _CMP_GT_OQ), _mm256_mul_ps(e, v)));
}
template <bool kSum, bool kEy>
TRL_AVX2 float exp_shift_avx2(float* x, int64_t n, float shift, float* ey) {
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) exp_lanes8<kSum, kEy>(x + i, sh, acc, acc2);
  if (i < n) {  // the tail padded with -inf: e = 0, which adds nothing to either sum
    alignas(32) float t[8];
    for (int k = 0; k < 8; ++k) t[k] = i + k < n ? x[i + k] : -INFINITY;
    exp_lanes8<kSum, kEy>(t, sh, acc, acc2);
    std::memcpy(x + i, t, static_cast<size_t>(n - i) * sizeof(float));
  }
  if (kEy) *ey = hsum8(acc2);
  return kSum ? hsum8(acc) : 0.0f;
}
TRL_AVX2 __attribute__((always_inline)) inline __m256 load_bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
TRL_AVX2 __attribute__((always_inline)) inline __m256i round_bf16x8_bits(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000)), nan);
}
TRL_AVX2 __attribute__((always_inline)) inline __m256 round_bf16x8(__m256 x) {
  return _mm256_castsi256_ps(_mm256_and_si256(round_bf16x8_bits(x), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
TRL_AVX2 __attribute__((always_inline)) inline void store_bf16x8(uint16_t* p, __m256 x) {
  const __m256i hi = _mm256_srli_epi32(round_bf16x8_bits(x), 16);  // 8 values < 2^16 in 32-bit lanes
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
TRL_AVX2 __attribute__((always_inline)) inline __m256 sigmoid8(__m256 g) {
  const __m256 t = exp_nonpositive8(_mm256_or_ps(g, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)))));
  const __m256 num = _mm256_blendv_ps(_mm256_set1_ps(1.0f), t, _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ));
  return _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), t));
}
TRL_AVX2 void swiglu_bf16_avx2(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = load_bf16x8(g + i);
    store_bf16x8(out + i, _mm256_mul_ps(round_bf16x8(_mm256_mul_ps(gv, sigmoid8(gv))), load_bf16x8(u + i)));
  }
  if (i < n) {
    alignas(32) uint16_t gt[8] = {}, ut[8] = {}, ot[8];
    std::memcpy(gt, g + i, static_cast<size_t>(n - i) * 2);
    std::memcpy(ut, u + i, static_cast<size_t>(n - i) * 2);
    swiglu_bf16_avx2(gt, ut, 8, ot);
    std::memcpy(out + i, ot, static_cast<size_t>(n - i) * 2);
  }
}
TRL_AVX2 void swiglu_backward_bf16_avx2(const uint16_t* g, const uint16_t* u, const uint16_t* dy, int64_t n, uint16_t* dg, uint16_t* du) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = load_bf16x8(g + i), uv = load_bf16x8(u + i), d = load_bf16x8(dy + i), sig = sigmoid8(gv);
    const __m256 dsilu = _mm256_mul_ps(sig, _mm256_add_ps(one, _mm256_mul_ps(gv, _mm256_sub_ps(one, sig))));
    store_bf16x8(dg + i, _mm256_mul_ps(_mm256_mul_ps(d, uv), dsilu));
    store_bf16x8(du + i, _mm256_mul_ps(_mm256_mul_ps(d, gv), sig));
  }
  if (i < n) {
    alignas(32) uint16_t gt[8] = {}, ut[8] = {}, dt[8] = {}, dgt[8], dut[8];
    std::memcpy(gt, g + i, static_cast<size_t>(n - i) * 2);
    std::memcpy(ut, u + i, static_cast<size_t>(n - i) * 2);
    std::memcpy(dt, dy + i, static_cast<size_t>(n - i) * 2);
    swiglu_backward_bf16_avx2(gt, ut, dt, 8, dgt, dut);
    std::memcpy(dg + i, dgt, static_cast<size_t>(n - i) * 2);
    std::memcpy(du + i, dut, static_cast<size_t>(n - i) * 2);
  }
}
#undef TRL_AVX2

// The exponential kernels' family, read on first use (not at load time: a process that never runs a kernel never
// asks the CPU anything). TRL_NO_AVX512=1 takes the AVX2 family on an AVX-512 CPU (cpu_features(); the AVX2 pass).
enum class ExpFamily { kGeneric, kAvx2, kAvx512 };
ExpFamily exp_family() {
  static const ExpFamily f = [] {
    const CpuFeatures& c = cpu_features();
    if (c.avx512f) return ExpFamily::kAvx512;
    if (c.avx2 && c.fma) return ExpFamily::kAvx2;
    return ExpFamily::kGeneric;
  }();
  return f;
}
#else
enum class ExpFamily { kGeneric, kAvx2, kAvx512 };
constexpr ExpFamily exp_family() { return ExpFamily::kGeneric; }
template <bool kSum, bool kEy>
float exp_shift_avx512(float*, int64_t, float, float*) { __builtin_trap(); }
template <bool kSum, bool kEy>
float exp_shift_avx2(float*, int64_t, float, float*) { __builtin_trap(); }
void swiglu_bf16_avx512(const uint16_t*, const uint16_t*, int64_t, uint16_t*) { __builtin_trap(); }
void swiglu_backward_bf16_avx512(const uint16_t*, const uint16_t*, const uint16_t*, int64_t, uint16_t*, uint16_t*) { __builtin_trap(); }
void swiglu_bf16_avx2(const uint16_t*, const uint16_t*, int64_t, uint16_t*) { __builtin_trap(); }
void swiglu_backward_bf16_avx2(const uint16_t*, const uint16_t*, const uint16_t*, int64_t, uint16_t*, uint16_t*) { __builtin_trap(); }
#endif

const char* exp_kernel() {
  switch (exp_family()) {
    case ExpFamily::kAvx512: return "avx512";
    case ExpFamily::kAvx2: return "avx2";
    default: return "portable";
  }
}
bool swiglu_bf16_available() { return exp_family() != ExpFamily::kGeneric; }
void swiglu_bf16(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out) {
  switch (exp_family()) {
    case ExpFamily::kAvx512: return swiglu_bf16_avx512(g, u, n, out);
    case ExpFamily::kAvx2: return swiglu_bf16_avx2(g, u, n, out);
    default: __builtin_trap();
  }
}
void swiglu_backward_bf16(const uint16_t* g, const uint16_t* u, const uint16_t* dy, int64_t n, uint16_t* dg, uint16_t* du) {
  switch (exp_family()) {
    case ExpFamily::kAvx512: return swiglu_backward_bf16_avx512(g, u, dy, n, dg, du);
    case ExpFamily::kAvx2: return swiglu_backward_bf16_avx2(g, u, dy, n, dg, du);
    default: __builtin_trap();
  }
}

template <bool kSum, bool kEy>
float exp_shift_dispatch(float* x, int64_t n, float shift, float* ey) {
  switch (exp_family()) {
    case ExpFamily::kAvx512: return exp_shift_avx512<kSum, kEy>(x, n, shift, ey);
    case ExpFamily::kAvx2: return exp_shift_avx2<kSum, kEy>(x, n, shift, ey);
    default: return kEy ? exp_shift_sum_ey_any(x, n, shift, ey) : kSum ? exp_shift_sum_any(x, n, shift) : (exp_shift_any(x, n, shift), 0.0f);
  }
}
void exp_shift(float* x, int64_t n, float shift) { exp_shift_dispatch<false, false>(x, n, shift, nullptr); }
float exp_shift_sum(float* x, int64_t n, float shift) { return exp_shift_dispatch<true, false>(x, n, shift, nullptr); }
float exp_shift_sum_ey(float* x, int64_t n, float shift, float* ey) { return exp_shift_dispatch<true, true>(x, n, shift, ey); }

// The weight rows of a decoding GEMV stream from memory one after the other: reading kPrefetchAhead elements (1 KiB of
// bf16) ahead of the loads keeps more cache misses in flight than the hardware prefetcher alone (measured on
// batch-1 decode of Qwen3-0.6B: 19.6 -> 23.4 tok/s, docs/PERFORMANCE.md). Past the row it reads the next one, which
// is the next the caller takes; prefetches never fault.
constexpr int64_t kPrefetchAhead = 512;
__attribute__((always_inline)) inline void prefetch_ahead(const uint16_t* w) { __builtin_prefetch(w + kPrefetchAhead, 0, 3); }
// Whether the row kernels prefetch, by vendor: on Intel (Sapphire Rapids) it raised batch-1 decode from 19.6 to 23.4
// tok/s; on AMD (Zen 4) the hardware prefetchers keep the stream going alone, and the prefetches cost 2-10% of the
// row kernels' bandwidth (bench/row_stream.cpp: in-process alternating passes over a 311-622 MB weight, 1 and 2
// threads, the AVX512-BF16 kernel and the AVX2 build of the widening one; docs/PERFORMANCE.md, "Batch-1 decode and
// the read bound").
static bool prefetch_rows() {
  static const bool on = cpu_features().vendor != "AuthenticAMD";
  return on;
}

template <bool kPrefetch>
__attribute__((always_inline)) inline float dot_bf16_impl(const float* a, const uint16_t* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n;) {
    // chunks of 256 elements (8 cache lines of b) with their prefetches first: a branch in the 16-lane loop
    // would stop GCC vectorising it
    if (kPrefetch)
      for (int64_t l = 0; l < 256; l += 32) prefetch_ahead(b + i + l);
    const int64_t end = i + 256 <= n ? i + 256 : n;
    for (; i + 16 <= end; i += 16)
      for (int k = 0; k < 16; ++k) acc[k] += a[i + k] * bf16_to_f32(b[i + k]);
  }
  float s = 0;
  for (int k = 0; k < 16; ++k) s += acc[k];
  for (; i < n; ++i) s += a[i] * bf16_to_f32(b[i]);
  return s;
}
TRL_MULTIVERSION float dot_bf16_prefetching(const float* a, const uint16_t* b, int64_t n) { return dot_bf16_impl<true>(a, b, n); }
TRL_MULTIVERSION float dot_bf16_streaming(const float* a, const uint16_t* b, int64_t n) { return dot_bf16_impl<false>(a, b, n); }
float dot_bf16(const float* a, const uint16_t* b, int64_t n) { return prefetch_rows() ? dot_bf16_prefetching(a, b, n) : dot_bf16_streaming(a, b, n); }
// out[m] = x[m, :]·w for M <= 8 rows of x and one bf16 row w, reading w once. One instantiation per M, so the
// M x 16 accumulators stay in registers.
template <int M, bool kPrefetch>
__attribute__((always_inline)) inline void dots_bf16_impl(const float* x, int64_t K, const uint16_t* w, float* out) {
  float acc[M][16] = {};
  int64_t i = 0;
  for (; i + 16 <= K;) {
    if (kPrefetch)
      for (int64_t l = 0; l < 256; l += 32) prefetch_ahead(w + i + l);  // as in dot_bf16
    const int64_t end = i + 256 <= K ? i + 256 : K;
    for (; i + 16 <= end; i += 16) {
      float wf[16];
      for (int k = 0; k < 16; ++k) wf[k] = bf16_to_f32(w[i + k]);
      for (int m = 0; m < M; ++m)
        for (int k = 0; k < 16; ++k) acc[m][k] += x[m * K + i + k] * wf[k];
    }
  }
  for (int m = 0; m < M; ++m) {
    float s = 0;
    for (int k = 0; k < 16; ++k) s += acc[m][k];
    for (int64_t j = i; j < K; ++j) s += x[m * K + j] * bf16_to_f32(w[j]);
    out[m] = s;
  }
}
#define TRL_DOTS(M)                                                                                                     \
  TRL_MULTIVERSION void dots_bf16_##M##_prefetching(const float* x, int64_t K, const uint16_t* w, float* out) {       \
    dots_bf16_impl<M, true>(x, K, w, out);                                                                            \
  }                                                                                                                   \
  TRL_MULTIVERSION void dots_bf16_##M##_streaming(const float* x, int64_t K, const uint16_t* w, float* out) {         \
    dots_bf16_impl<M, false>(x, K, w, out);                                                                           \
  }
TRL_DOTS(2)
TRL_DOTS(3)
TRL_DOTS(4)
TRL_DOTS(5)
TRL_DOTS(6)
TRL_DOTS(7)
TRL_DOTS(8)
#undef TRL_DOTS
void dots_bf16(const float* x, int64_t M, int64_t K, const uint16_t* w, float* out) {
  using Rows = void (*)(const float*, int64_t, const uint16_t*, float*);
  static const Rows prefetching[] = {dots_bf16_2_prefetching, dots_bf16_3_prefetching, dots_bf16_4_prefetching, dots_bf16_5_prefetching,
                                     dots_bf16_6_prefetching, dots_bf16_7_prefetching, dots_bf16_8_prefetching};
  static const Rows streaming[] = {dots_bf16_2_streaming, dots_bf16_3_streaming, dots_bf16_4_streaming, dots_bf16_5_streaming,
                                   dots_bf16_6_streaming, dots_bf16_7_streaming, dots_bf16_8_streaming};
  const bool prefetch = prefetch_rows();
  if (M == 1) {
    out[0] = prefetch ? dot_bf16_prefetching(x, w, K) : dot_bf16_streaming(x, w, K);
    return;
  }
  const int64_t rows = M > 8 ? 8 : M < 2 ? 2 : M;  // M > 8 is taken as 8, as documented
  (prefetch ? prefetching : streaming)[rows - 2](x, K, w, out);
}
#if defined(__x86_64__)
// The same with bf16 rows of x, on AVX512-BF16 (vdpbf16ps: pairs of bf16 products summed in f32). Selected at run
// time when the CPU has it and the activations are bf16.
// U independent accumulators per row (U·M chains in flight): with one chain per row, M ≤ 4 rows leave the loop
// bound by vdpbf16ps's latency (measured: batch-4 decode at 2.2x batch 1's time per step), not by the weight loads.
template <int M, bool kPrefetch>
__attribute__((target("avx512f,avx512bf16"))) void dots_bf16bf16_impl(const uint16_t* x, int64_t K, const uint16_t* w, float* out) {
  constexpr int U = M <= 2 ? 4 : M <= 4 ? 2 : 1;
  __m512 acc[U][M];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < M; ++m) acc[u][m] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 * U <= K; i += 32 * U)
    for (int u = 0; u < U; ++u) {
      if (kPrefetch) prefetch_ahead(w + i + 32 * u);
      const __m512bh wv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + i + 32 * u));
      for (int m = 0; m < M; ++m)
        acc[u][m] = _mm512_dpbf16_ps(acc[u][m], reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + m * K + i + 32 * u)), wv);
    }
  for (; i + 32 <= K; i += 32) {
    const __m512bh wv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + i));
    for (int m = 0; m < M; ++m) acc[0][m] = _mm512_dpbf16_ps(acc[0][m], reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + m * K + i)), wv);
  }
  for (int m = 0; m < M; ++m) {
    __m512 total = acc[0][m];
    for (int u = 1; u < U; ++u) total = _mm512_add_ps(total, acc[u][m]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, total);  // (GCC 12 warns falsely inside _mm512_reduce_add_ps)
    float s = 0;
    for (float l : lanes) s += l;
    for (int64_t j = i; j < K; ++j) s += bf16_to_f32(x[m * K + j]) * bf16_to_f32(w[j]);
    out[m] = s;
  }
}
// One row: four independent accumulators, so the loop is bound by loads rather than by the dot product's latency.
template <bool kPrefetch>
__attribute__((target("avx512f,avx512bf16"))) float dot_bf16bf16_impl(const uint16_t* x, int64_t K, const uint16_t* w) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
#define ld16(p) reinterpret_cast<__m512bh>(_mm512_loadu_si512(p))
  int64_t i = 0;
  for (; i + 128 <= K; i += 128) {
    if (kPrefetch)
      for (int l = 0; l < 4; ++l) prefetch_ahead(w + i + 32 * l);
    a0 = _mm512_dpbf16_ps(a0, ld16(x + i), ld16(w + i));
    a1 = _mm512_dpbf16_ps(a1, ld16(x + i + 32), ld16(w + i + 32));
    a2 = _mm512_dpbf16_ps(a2, ld16(x + i + 64), ld16(w + i + 64));
    a3 = _mm512_dpbf16_ps(a3, ld16(x + i + 96), ld16(w + i + 96));
  }
  for (; i + 32 <= K; i += 32) a0 = _mm512_dpbf16_ps(a0, ld16(x + i), ld16(w + i));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < K; ++i) s += bf16_to_f32(x[i]) * bf16_to_f32(w[i]);
  return s;
}
#undef ld16
template <bool kPrefetch>
static void dots_bf16bf16_rows(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, float* out) {
  switch (M) {
    case 1: out[0] = dot_bf16bf16_impl<kPrefetch>(x, K, w); return;
    case 2: return dots_bf16bf16_impl<2, kPrefetch>(x, K, w, out);
    case 3: return dots_bf16bf16_impl<3, kPrefetch>(x, K, w, out);
    case 4: return dots_bf16bf16_impl<4, kPrefetch>(x, K, w, out);
    case 5: return dots_bf16bf16_impl<5, kPrefetch>(x, K, w, out);
    case 6: return dots_bf16bf16_impl<6, kPrefetch>(x, K, w, out);
    case 7: return dots_bf16bf16_impl<7, kPrefetch>(x, K, w, out);
    default: return dots_bf16bf16_impl<8, kPrefetch>(x, K, w, out);
  }
}
void dots_bf16bf16(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, float* out) {
  return prefetch_rows() ? dots_bf16bf16_rows<true>(x, M, K, w, out) : dots_bf16bf16_rows<false>(x, M, K, w, out);
}
#endif
bool dots_bf16bf16_available() {
  static const bool on = cpu_features().avx512bf16 && std::getenv("TRL_NO_AVX512BF16") == nullptr;
  return on;
}
// x[i] = round_bf16(x[i]) (round to nearest even; NaN stays NaN), vectorised.
TRL_MULTIVERSION void round_to_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    __builtin_memcpy(&b, &x[i], 4);
    const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
    const uint32_t r = ((b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u);
    const uint32_t out = nan ? (b | 0x00400000u) & 0xffff0000u : r;
    __builtin_memcpy(&x[i], &out, 4);
  }
}
namespace {
__attribute__((always_inline)) inline uint16_t round_bits(uint32_t b) {
  const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>((nan ? (b | 0x00400000u) : b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
}  // namespace
TRL_MULTIVERSION void to_bf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    __builtin_memcpy(&b, x + i, 4);
    out[i] = round_bits(b);
  }
}
TRL_MULTIVERSION void scale_to_bf16(const float* x, int64_t n, float a, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = a * x[i];
    uint32_t b;
    __builtin_memcpy(&b, &v, 4);
    out[i] = round_bits(b);
  }
}
TRL_MULTIVERSION void add_bf16(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t ua = static_cast<uint32_t>(a[i]) << 16, ub = static_cast<uint32_t>(b[i]) << 16;
    float fa, fb;
    __builtin_memcpy(&fa, &ua, 4);
    __builtin_memcpy(&fb, &ub, 4);
    const float s = fa + fb;
    uint32_t us;
    __builtin_memcpy(&us, &s, 4);
    out[i] = round_bits(us);
  }
}
// y += a·x for bf16 x.
TRL_MULTIVERSION void axpy_bf16(float* y, float a, const uint16_t* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * bf16_to_f32(x[i]);
}
TRL_MULTIVERSION float sum(const float* x, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n;) {
    for (int64_t l = 0; l < 256; l += 16) __builtin_prefetch(x + i + l + kPrefetchAhead, 0, 3);  // as in dot_bf16
    const int64_t end = i + 256 <= n ? i + 256 : n;
    for (; i + 16 <= end; i += 16)
      for (int k = 0; k < 16; ++k) acc[k] += x[i + k];
  }
  float s = 0;
  for (int k = 0; k < 16; ++k) s += acc[k];
  for (; i < n; ++i) s += x[i];
  return s;
}

}  // namespace trl::cpu::vec

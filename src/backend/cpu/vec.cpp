// Vector kernels of the CPU backend: the hot inner loops (reductions GCC will not vectorise on its own), each
// compiled for AVX-512, AVX2 and the x86-64 baseline; the loader picks one at run time (GCC target_clones), so the
// binary runs anywhere and never needs -march=native. The AVX512-BF16 dot products are separate functions that
// callers select when cpu_features().avx512bf16 says so. Every function works on one row (n or K elements) and is
// callable on its own (tests/backend/op_table_test.cpp, dev micro-benchmarks).
#include "backend/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>

#include "trl/core/dtype.h"

namespace trl::cpu::vec {

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
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
// x[i] = exp(x[i] - shift).
TRL_MULTIVERSION void exp_shift(float* x, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) x[i] = exp_nonpositive(x[i] - shift);
}
// x ← e^(x - shift), and returns Σ e^(x-shift); with ey, also *ey = Σ e^(x-shift)·(x-shift) (entropy): one pass.
template <bool kEy>
__attribute__((always_inline)) inline float exp_shift_sum_impl(float* x, int64_t n, float shift, float* ey) {
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
  return s;
}
TRL_MULTIVERSION float exp_shift_sum(float* x, int64_t n, float shift) { return exp_shift_sum_impl<false>(x, n, shift, nullptr); }
TRL_MULTIVERSION float exp_shift_sum_ey(float* x, int64_t n, float shift, float* ey) { return exp_shift_sum_impl<true>(x, n, shift, ey); }
TRL_MULTIVERSION float max(const float* x, int64_t n) {
  float acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = -INFINITY;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] = acc[k] > x[i + k] ? acc[k] : x[i + k];
  float m = -INFINITY;
  for (int k = 0; k < 16; ++k) m = m > acc[k] ? m : acc[k];
  for (; i < n; ++i) m = m > x[i] ? m : x[i];
  return m;
}

// ---- distillation: one row of a chunk of both models' logits (ops_distill.cpp) ----

TRL_MULTIVERSION void jsd_pass1_row(const float* zs, const float* zt, int64_t n, float ms, float mt, int mode, double* ss, double* st, double* a) {
  // f64 sums: a row's lse must be exact to ~1e-8 (the mixture's gradient is a small difference of O(1) terms).
  // The KL term's two forms are weighted by 0/1 instead of chosen by a branch, so the loop vectorises.
  const float wt = mode == 0 ? 1.0f : 0.0f, ws = mode == 1 ? 1.0f : 0.0f;
  double as[8] = {}, at[8] = {}, aa[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) {
      const float es = exp_nonpositive(zs[i + k] - ms), et = exp_nonpositive(zt[i + k] - mt), diff = zt[i + k] - zs[i + k];
      as[k] += es, at[k] += et;
      aa[k] += (wt * et - ws * es) * diff;
    }
  double s1 = 0, s2 = 0, s3 = 0;
  for (int k = 0; k < 8; ++k) s1 += as[k], s2 += at[k], s3 += aa[k];
  for (; i < n; ++i) {
    const float es = exp_nonpositive(zs[i] - ms), et = exp_nonpositive(zt[i] - mt), diff = zt[i] - zs[i];
    s1 += es, s2 += et;
    s3 += (wt * et - ws * es) * diff;
  }
  *ss = s1, *st = s2, *a = s3;
}

// e^x − 1 for x <= 0 with relative precision near 0: a degree-8 Taylor polynomial above −0.5 (error < 1e-8
// relative), e^x − 1 below (no cancellation there).
__attribute__((always_inline)) inline float expm1_nonpositive(float x) {
  const float p = x * (1.0f + x * (0.5f + x * (0.166666672f + x * (0.0416666679f + x * (0.00833333377f + x * (0.00138888892f + x * (1.98412701e-04f + x * 2.48015876e-05f)))))));
  const float e = exp_nonpositive(x) - 1.0f;
  return x > -0.5f ? p : e;
}
// log(1 + u) for −1 < u <= 0 with relative precision near 0: 2·atanh(u / (2 + u)) by its odd series above −0.29,
// log_positive(1 + u) below.
__attribute__((always_inline)) inline float log1p_nonpositive(float u) {
  const float s = u / (2.0f + u), s2 = s * s;
  const float series = 2.0f * s * (1.0f + s2 * (0.333333343f + s2 * (0.2f + s2 * (0.142857149f + s2 * 0.111111112f))));
  const float direct = log_positive(1.0f + u);
  return u > -0.29f ? series : direct;
}
// Element i's S = e^(log S), T = e^(log T) and the small log-ratios log S/M, log T/M (shift = {lse hi, lse lo,
// lse_t hi, lse_t lo, lse_t − lse}), M = (1 − β)·S + β·T. With d = log T − log S they are formed from d alone
// (never as a difference of two large log-probabilities, whose f32 rounding would not cancel), with relative
// precision where S ≈ T: log S/M = −log(1 + β·expm1(d)) for d <= 0, −d − log(1 + (1 − β)·expm1(−d)) for d > 0;
// log T/M = d + log S/M.
struct JsdTerms {
  float d, S, T, lsm, ltm;
};
__attribute__((always_inline)) inline JsdTerms jsd_terms(float zs, float zt, const float* shift, float beta) {
  JsdTerms t;
  t.S = exp_nonpositive((zs - shift[0]) - shift[1]);
  t.T = exp_nonpositive((zt - shift[2]) - shift[3]);
  t.d = (zt - zs) - shift[4];
  const bool neg = t.d <= 0.0f;
  const float x = neg ? t.d : -t.d, b = neg ? beta : 1.0f - beta, dpos = neg ? 0.0f : t.d;
  const float u = b * expm1_nonpositive(x);
  t.lsm = -(dpos + log1p_nonpositive(u));
  t.ltm = t.d + t.lsm;
  return t;
}

TRL_MULTIVERSION void jsd_pass2_row(const float* zs, const float* zt, int64_t n, const float* shift, float beta, double* kt, double* ks) {
  double at[8] = {}, as[8] = {};  // f64: KL(S‖M) is the gradient's row constant (see jsd_pass1_row)
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) {
      const JsdTerms t = jsd_terms(zs[i + k], zt[i + k], shift, beta);
      at[k] += t.T * t.ltm, as[k] += t.S * t.lsm;
    }
  double s1 = 0, s2 = 0;
  for (int k = 0; k < 8; ++k) s1 += at[k], s2 += as[k];
  for (; i < n; ++i) {
    const JsdTerms t = jsd_terms(zs[i], zt[i], shift, beta);
    s1 += t.T * t.ltm, s2 += t.S * t.lsm;
  }
  *kt = s1, *ks = s2;
}

TRL_MULTIVERSION void jsd_grad_row(float* zs, const float* zt, int64_t n, const float* shift, float beta, float g, float kl_hi, float kl_lo) {
  // One loop per form (the branch is outside them), so each vectorises.
  if (beta == 0.0f) {
    for (int64_t i = 0; i < n; ++i) {
      const JsdTerms t = jsd_terms(zs[i], zt[i], shift, 0.5f);
      zs[i] = g * (t.S - t.T);
    }
  } else if (beta == 1.0f) {
    for (int64_t i = 0; i < n; ++i) {
      const JsdTerms t = jsd_terms(zs[i], zt[i], shift, 0.5f);
      zs[i] = g * t.S * ((-t.d - kl_hi) - kl_lo);
    }
  } else {
    const float gb = g * (1.0f - beta);
    for (int64_t i = 0; i < n; ++i) {
      const JsdTerms t = jsd_terms(zs[i], zt[i], shift, beta);
      zs[i] = gb * t.S * ((t.lsm - kl_hi) - kl_lo);
    }
  }
}

TRL_MULTIVERSION float dot_bf16(const float* a, const uint16_t* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += a[i + k] * bf16_to_f32(b[i + k]);
  float s = 0;
  for (int k = 0; k < 16; ++k) s += acc[k];
  for (; i < n; ++i) s += a[i] * bf16_to_f32(b[i]);
  return s;
}
// out[m] = x[m, :]·w for M <= 8 rows of x and one bf16 row w, reading w once. One instantiation per M, so the
// M x 16 accumulators stay in registers.
template <int M>
__attribute__((always_inline)) inline void dots_bf16_impl(const float* x, int64_t K, const uint16_t* w, float* out) {
  float acc[M][16] = {};
  int64_t i = 0;
  for (; i + 16 <= K; i += 16) {
    float wf[16];
    for (int k = 0; k < 16; ++k) wf[k] = bf16_to_f32(w[i + k]);
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < 16; ++k) acc[m][k] += x[m * K + i + k] * wf[k];
  }
  for (int m = 0; m < M; ++m) {
    float s = 0;
    for (int k = 0; k < 16; ++k) s += acc[m][k];
    for (int64_t j = i; j < K; ++j) s += x[m * K + j] * bf16_to_f32(w[j]);
    out[m] = s;
  }
}
#define TRL_DOTS(M) \
  TRL_MULTIVERSION void dots_bf16_##M(const float* x, int64_t K, const uint16_t* w, float* out) { dots_bf16_impl<M>(x, K, w, out); }
TRL_DOTS(2)
TRL_DOTS(3)
TRL_DOTS(4)
TRL_DOTS(5)
TRL_DOTS(6)
TRL_DOTS(7)
TRL_DOTS(8)
#undef TRL_DOTS
void dots_bf16(const float* x, int64_t M, int64_t K, const uint16_t* w, float* out) {
  switch (M) {
    case 1: out[0] = dot_bf16(x, w, K); return;
    case 2: return dots_bf16_2(x, K, w, out);
    case 3: return dots_bf16_3(x, K, w, out);
    case 4: return dots_bf16_4(x, K, w, out);
    case 5: return dots_bf16_5(x, K, w, out);
    case 6: return dots_bf16_6(x, K, w, out);
    case 7: return dots_bf16_7(x, K, w, out);
    default: return dots_bf16_8(x, K, w, out);
  }
}
#if defined(__x86_64__)
// The same with bf16 rows of x, on AVX512-BF16 (vdpbf16ps: pairs of bf16 products summed in f32). Selected at run
// time when the CPU has it and the activations are bf16.
// U independent accumulators per row (U·M chains in flight): with one chain per row, M ≤ 4 rows leave the loop
// bound by vdpbf16ps's latency (measured: batch-4 decode at 2.2x batch 1's time per step), not by the weight loads.
template <int M>
__attribute__((target("avx512f,avx512bf16"))) void dots_bf16bf16_impl(const uint16_t* x, int64_t K, const uint16_t* w, float* out) {
  constexpr int U = M <= 2 ? 4 : M <= 4 ? 2 : 1;
  __m512 acc[U][M];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < M; ++m) acc[u][m] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 * U <= K; i += 32 * U)
    for (int u = 0; u < U; ++u) {
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
__attribute__((target("avx512f,avx512bf16"))) float dot_bf16bf16(const uint16_t* x, int64_t K, const uint16_t* w) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
#define ld16(p) reinterpret_cast<__m512bh>(_mm512_loadu_si512(p))
  int64_t i = 0;
  for (; i + 128 <= K; i += 128) {
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
__attribute__((target("avx512f,avx512bf16"))) void dots_bf16bf16(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, float* out) {
  switch (M) {
    case 1: out[0] = dot_bf16bf16(x, K, w); return;
    case 2: return dots_bf16bf16_impl<2>(x, K, w, out);
    case 3: return dots_bf16bf16_impl<3>(x, K, w, out);
    case 4: return dots_bf16bf16_impl<4>(x, K, w, out);
    case 5: return dots_bf16bf16_impl<5>(x, K, w, out);
    case 6: return dots_bf16bf16_impl<6>(x, K, w, out);
    case 7: return dots_bf16bf16_impl<7>(x, K, w, out);
    default: return dots_bf16bf16_impl<8>(x, K, w, out);
  }
}
#endif
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
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += x[i + k];
  float s = 0;
  for (int k = 0; k < 16; ++k) s += acc[k];
  for (; i < n; ++i) s += x[i];
  return s;
}

}  // namespace trl::cpu::vec

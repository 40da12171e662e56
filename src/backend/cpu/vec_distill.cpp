// The distillation row kernels (vec.h, "Distillation"; ops_distill.cpp), compiled like vec.cpp for AVX-512, AVX2 and
// the baseline, and with -fno-trapping-math (CMakeLists.txt): GCC's default -ftrapping-math keeps a branch in every
// `cond ? a : b` of the exp/log polynomials (it may not compute a value a branch would skip), which leaves these
// loops scalar — 4-10x slower here. Nothing reads the FP exception flags. (vec.cpp keeps the default for now: its
// kernels vectorised that way round differently in the last bits, which moves trajectory-sensitive tests; issue 18.)
#include <cmath>

#include "backend/cpu/vec.h"
#include "backend/cpu/vec_math.h"
#include "core/sanitizers.h"

namespace trl::cpu::vec {

#if defined(__x86_64__) && !TRL_ASAN
#define TRL_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TRL_MULTIVERSION
#endif

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

// ---- one row of a chunk of both models' logits ----

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

}  // namespace trl::cpu::vec

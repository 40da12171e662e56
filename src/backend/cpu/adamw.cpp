// AdamW's step on the CPU (Backend::adamw_step): one fused, OpenMP-parallel pass per tensor over the gradient, both
// moments, the f32 weight and its bf16 compute copy, in AVX-512 (16 lanes) or AVX2 (8 lanes) with the portable
// loop of backend/adamw_update.h for heads and tails: the same operations in the same order, so every kernel gives
// the portable loop's bits. A step streams ~30 bytes per parameter (gigabytes for a 0.6B model): bandwidth-bound.
#include "backend/cpu/adamw.h"

#include <cstdint>

#include <omp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/adamw_update.h"
#include "core/cpu_features.h"

namespace trl::cpu {

namespace {

#if defined(__x86_64__)
// AVX-512, 16 elements at a time. The pass streams ~30 bytes per parameter through memory (gigabytes for a 0.6B
// model): with every stored array aligned, the stores bypass the cache (non-temporal), which saves reading each
// destination line before writing it. Measured on the qwen3-0.6b step: docs/PERFORMANCE.md.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, falsely, inside _mm512_sqrt_ps
#endif
template <bool kFresh>
__attribute__((target("avx512f,avx512bw"))) TRL_NO_FP_CONTRACT void update_avx512(const float* g, float* m, float* v, float* w, uint16_t* w16, int64_t i0, int64_t i1,
                                                                const Backend::AdamWStep& u) {
  auto aligned = [](const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; };
  int64_t i = i0;
  // Scalar head up to a 64-byte boundary of m; then non-temporal stores if w, v (and w16 at 32 bytes) line up too.
  while (i < i1 && !aligned(m + i, 64)) ++i;
  adamw_update_scalar<kFresh>(g, m, v, w, w16, i0, i, u);
  const bool nt = aligned(v + i, 64) && aligned(w + i, 64) && (w16 == nullptr || aligned(w16 + i, 32));
  const __m512 one_b1 = _mm512_set1_ps(1.0f - u.b1), b2 = _mm512_set1_ps(u.b2), one_b2 = _mm512_set1_ps(1.0f - u.b2);
  const __m512 keep = _mm512_set1_ps(u.keep), step = _mm512_set1_ps(u.step_size), isb = _mm512_set1_ps(u.inv_sqrt_bc2), eps = _mm512_set1_ps(u.eps);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x00400000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), lsb = _mm512_set1_epi32(1);
  for (; i + 16 <= i1; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i);
    const __m512 m0 = kFresh ? _mm512_setzero_ps() : _mm512_loadu_ps(m + i), v0 = kFresh ? _mm512_setzero_ps() : _mm512_loadu_ps(v + i);
    const __m512 mi = _mm512_add_ps(m0, _mm512_mul_ps(one_b1, _mm512_sub_ps(gi, m0)));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, v0), _mm512_mul_ps(_mm512_mul_ps(one_b2, gi), gi));
    const __m512 den = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vi), isb), eps);
    const __m512 wi = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(w + i), keep), _mm512_div_ps(_mm512_mul_ps(step, mi), den));
    if (nt) {
      _mm512_stream_ps(m + i, mi), _mm512_stream_ps(v + i, vi), _mm512_stream_ps(w + i, wi);
    } else {
      _mm512_storeu_ps(m + i, mi), _mm512_storeu_ps(v + i, vi), _mm512_storeu_ps(w + i, wi);
    }
    if (w16 != nullptr) {  // f32_to_bf16: round to nearest even; a NaN keeps its sign and becomes quiet
      const __m512i bits = _mm512_castps_si512(wi);
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, abs_mask), inf);
      const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(bits, 16), lsb)));
      const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(bits, quiet)), 16));
      if (nt)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(w16 + i), h);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w16 + i), h);
    }
  }
  if (nt) _mm_sfence();  // order the streaming stores before whatever reads these tensors next
  adamw_update_scalar<kFresh>(g, m, v, w, w16, i, i1, u);
}
#pragma GCC diagnostic pop

// The same on AVX2, 8 elements at a time (the same operations in the same order: the same bits).
template <bool kFresh>
__attribute__((target("avx2"))) TRL_NO_FP_CONTRACT void update_avx2(const float* g, float* m, float* v, float* w, uint16_t* w16, int64_t i0, int64_t i1,
                                                                     const Backend::AdamWStep& u) {
  auto aligned = [](const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; };
  int64_t i = i0;
  while (i < i1 && !aligned(m + i, 32)) ++i;
  adamw_update_scalar<kFresh>(g, m, v, w, w16, i0, i, u);
  const bool nt = aligned(v + i, 32) && aligned(w + i, 32) && (w16 == nullptr || aligned(w16 + i, 16));
  const __m256 one_b1 = _mm256_set1_ps(1.0f - u.b1), b2 = _mm256_set1_ps(u.b2), one_b2 = _mm256_set1_ps(1.0f - u.b2);
  const __m256 keep = _mm256_set1_ps(u.keep), step = _mm256_set1_ps(u.step_size), isb = _mm256_set1_ps(u.inv_sqrt_bc2), eps = _mm256_set1_ps(u.eps);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x00400000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), lsb = _mm256_set1_epi32(1);
  for (; i + 8 <= i1; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 m0 = kFresh ? _mm256_setzero_ps() : _mm256_loadu_ps(m + i), v0 = kFresh ? _mm256_setzero_ps() : _mm256_loadu_ps(v + i);
    const __m256 mi = _mm256_add_ps(m0, _mm256_mul_ps(one_b1, _mm256_sub_ps(gi, m0)));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, v0), _mm256_mul_ps(_mm256_mul_ps(one_b2, gi), gi));
    const __m256 den = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), isb), eps);
    const __m256 wi = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(w + i), keep), _mm256_div_ps(_mm256_mul_ps(step, mi), den));
    if (nt) {
      _mm256_stream_ps(m + i, mi), _mm256_stream_ps(v + i, vi), _mm256_stream_ps(w + i, wi);
    } else {
      _mm256_storeu_ps(m + i, mi), _mm256_storeu_ps(v + i, vi), _mm256_storeu_ps(w + i, wi);
    }
    if (w16 != nullptr) {  // f32_to_bf16, as above
      const __m256i bits = _mm256_castps_si256(wi);
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf);
      const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(bits, 16), lsb)));
      const __m256i hi = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, _mm256_or_si256(bits, quiet), nan), 16);
      const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
      if (nt)
        _mm_stream_si128(reinterpret_cast<__m128i*>(w16 + i), h);
      else
        _mm_storeu_si128(reinterpret_cast<__m128i*>(w16 + i), h);
    }
  }
  if (nt) _mm_sfence();
  adamw_update_scalar<kFresh>(g, m, v, w, w16, i, i1, u);
}
#endif

template <bool kFresh>
void update(const float* g, float* m, float* v, float* w, uint16_t* w16, int64_t n, const Backend::AdamWStep& u) {
#if defined(__x86_64__)
  static const bool avx512 = cpu_features().avx512f && cpu_features().avx512bw, avx2 = cpu_features().avx2;
#endif
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t i0 = n * t / threads / 16 * 16, i1 = t + 1 == threads ? n : n * (t + 1) / threads / 16 * 16;
#if defined(__x86_64__)
    if (avx512)
      update_avx512<kFresh>(g, m, v, w, w16, i0, i1, u);
    else if (avx2)
      update_avx2<kFresh>(g, m, v, w, w16, i0, i1, u);
    else
#endif
      adamw_update_scalar<kFresh>(g, m, v, w, w16, i0, i1, u);
  }
}


}  // namespace

const char* adamw_kernel() {
#if defined(__x86_64__)
  if (cpu_features().avx512f && cpu_features().avx512bw) return "avx512";
  if (cpu_features().avx2) return "avx2";
#endif
  return "portable";
}

void adamw_step(const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& weight, Tensor* compute, const Backend::AdamWStep& step) {
  const AdamWArrays a = adamw_arrays(grad, exp_avg, exp_avg_sq, weight, compute);
  if (step.fresh)
    update<true>(a.g, a.m, a.v, a.w, a.w16, a.n, step);
  else
    update<false>(a.g, a.m, a.v, a.w, a.w16, a.n, step);
}

}  // namespace trl::cpu

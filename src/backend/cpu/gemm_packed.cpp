#include "backend/cpu/gemm_packed.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/elementwise.h"
#include "backend/cpu/vec.h"
#include "core/cpu_features.h"
#include "trl/core/error.h"

namespace trl::cpu {

namespace {

constexpr int64_t kMr = 6;     // rows of the register tile
constexpr int64_t kNr = 16;    // columns of the register tile (two 8-float vectors)
constexpr int64_t kKc = 256;   // K per packed block: a B panel is 16 KiB (L1)
constexpr int64_t kMc = 144;   // rows per task: an A block is 144 KiB (L2), 24 panels
constexpr int64_t kNc = 256;   // columns per task: the task's f32 tile is 144 KiB

// One operand element as f32.
inline float load(const void* p, DType dt, int64_t i) {
  return dt == DType::BF16 ? bf16_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// ---- packing, portable -------------------------------------------------------------------------------------------

// A rows [m0, m0+mc) × K [k0, k0+kc) → panels of 6 rows, k-major: ap[p·kc·6 + k·6 + i]; rows past M are 0.
void pack_a(const PackedGemm& g, const void* a, int64_t m0, int64_t mc, int64_t k0, int64_t kc, float* ap) {
  for (int64_t p = 0; p * kMr < mc; ++p) {
    float* dst = ap + p * kc * kMr;
    for (int64_t i = 0; i < kMr; ++i) {
      const int64_t m = m0 + p * kMr + i;
      if (m >= g.M || p * kMr + i >= mc) {
        for (int64_t k = 0; k < kc; ++k) dst[k * kMr + i] = 0.0f;
        continue;
      }
      const int64_t base = m * g.sa_m + k0 * g.sa_k;
      if (g.ta == DType::BF16) {
        const auto* s = static_cast<const uint16_t*>(a) + base;
        for (int64_t k = 0; k < kc; ++k) dst[k * kMr + i] = bf16_to_f32(s[k * g.sa_k]);
      } else {
        const auto* s = static_cast<const float*>(a) + base;
        for (int64_t k = 0; k < kc; ++k) dst[k * kMr + i] = s[k * g.sa_k];
      }
    }
  }
}

// B K [k0, k0+kc) × columns [n0, n0+16) → one panel, k-major: bp[k·16 + j]; columns past N are 0.
void pack_b_portable(const PackedGemm& g, const void* b, int64_t k0, int64_t kc, int64_t n0, float* bp) {
  const int64_t nv = std::min(kNr, g.N - n0);
  for (int64_t k = 0; k < kc; ++k) {
    float* dst = bp + k * kNr;
    const int64_t base = (k0 + k) * g.sb_k + n0 * g.sb_n;
    for (int64_t j = 0; j < nv; ++j) dst[j] = load(b, g.tb, base + j * g.sb_n);
    for (int64_t j = nv; j < kNr; ++j) dst[j] = 0.0f;
  }
}

// ---- micro-kernels: c[6×16] (+)= Σ_k a[k·6 + i]·b[k·16 + j] ----------------------------------------------------------

void kernel_portable(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool first) {
  float acc[kMr][kNr];
  for (int64_t i = 0; i < kMr; ++i)
    for (int64_t j = 0; j < kNr; ++j) acc[i][j] = first ? 0.0f : c[i * ldc + j];
  for (int64_t k = 0; k < kc; ++k)
    for (int64_t i = 0; i < kMr; ++i)
      for (int64_t j = 0; j < kNr; ++j) acc[i][j] += a[k * kMr + i] * b[k * kNr + j];
  for (int64_t i = 0; i < kMr; ++i)
    for (int64_t j = 0; j < kNr; ++j) c[i * ldc + j] = acc[i][j];
}

#if defined(__x86_64__)
#define TRL_AVX2 __attribute__((target("avx2,fma")))

// 12 accumulators, two B vectors and one broadcast A value: 15 of the 16 ymm registers.
TRL_AVX2 void kernel_avx2(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool first) {
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  if (first) {
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
  } else {
    c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
    c10 = _mm256_loadu_ps(c + ldc), c11 = _mm256_loadu_ps(c + ldc + 8);
    c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
    c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
    c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
    c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
  }
  for (int64_t k = 0; k < kc; ++k, a += kMr, b += kNr) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 x = _mm256_broadcast_ss(a);
    c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a + 2);
    c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a + 3);
    c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a + 4);
    c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a + 5);
    c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
  }
  _mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + 8, c01);
  _mm256_storeu_ps(c + ldc, c10), _mm256_storeu_ps(c + ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
  _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
  _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

// 8 values from p (f32, or bf16 widened: a bf16 is the upper half of its f32).
TRL_AVX2 inline __m256 load8(const void* p, DType dt, int64_t i) {
  if (dt == DType::BF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

// r[0..8) ← its transpose (r[q] holds element q of every input row).
TRL_AVX2 inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20), r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20), r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31), r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31), r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// pack_b_portable with vector loads where the panel is whole: rows of B contiguous in n (sb_n = 1: two loads per
// k), or columns contiguous in k (sb_k = 1, a weight in nn.Linear layout: 8×8 blocks transposed in registers).
TRL_AVX2 void pack_b_avx2(const PackedGemm& g, const void* b, int64_t k0, int64_t kc, int64_t n0, float* bp) {
  if (g.N - n0 >= kNr && g.sb_n == 1) {
    for (int64_t k = 0; k < kc; ++k) {
      const int64_t base = (k0 + k) * g.sb_k + n0;
      _mm256_storeu_ps(bp + k * kNr, load8(b, g.tb, base));
      _mm256_storeu_ps(bp + k * kNr + 8, load8(b, g.tb, base + 8));
    }
    return;
  }
  if (g.N - n0 >= kNr && g.sb_k == 1) {
    const int64_t k8 = kc / 8 * 8;
    for (int64_t half = 0; half < 2; ++half) {
      const int64_t col = n0 + half * 8;
      for (int64_t k = 0; k < k8; k += 8) {
        __m256 r[8];
        for (int64_t j = 0; j < 8; ++j) r[j] = load8(b, g.tb, (col + j) * g.sb_n + k0 + k);
        transpose8(r);
        for (int64_t q = 0; q < 8; ++q) _mm256_storeu_ps(bp + (k + q) * kNr + half * 8, r[q]);
      }
      for (int64_t k = k8; k < kc; ++k)
        for (int64_t j = 0; j < 8; ++j) bp[k * kNr + half * 8 + j] = load(b, g.tb, (col + j) * g.sb_n + k0 + k);
    }
    return;
  }
  pack_b_portable(g, b, k0, kc, n0, bp);
}
#endif

// ---- the driver ------------------------------------------------------------------------------------------------------

using MicroKernel = void (*)(int64_t, const float*, const float*, float*, int64_t, bool);
using PackB = void (*)(const PackedGemm&, const void*, int64_t, int64_t, int64_t, float*);

// One task: C rows [m0, m0+mc) × columns [n0, n0+nc), all of K, into the f32 tile t (mc rounded up to 6 rows,
// nc up to 16 columns, row stride kNc), then stored.
void run_task(const PackedGemm& g, MicroKernel kernel, PackB pack_b, const void* a, const void* b, void* c, const float* bias, bool accumulate,
              int64_t m0, int64_t mc, int64_t n0, int64_t nc) {
  thread_local std::vector<float> ap, bp, tile;
  ap.resize(static_cast<size_t>(kMc * kKc)), bp.resize(static_cast<size_t>(kKc * kNr)), tile.resize(static_cast<size_t>(kMc * kNc));
  const int64_t panels_m = (mc + kMr - 1) / kMr, panels_n = (nc + kNr - 1) / kNr;
  if (g.K == 0) std::fill(tile.begin(), tile.end(), 0.0f);
  for (int64_t k0 = 0; k0 < g.K; k0 += kKc) {
    const int64_t kc = std::min(kKc, g.K - k0);
    pack_a(g, a, m0, mc, k0, kc, ap.data());
    for (int64_t pn = 0; pn < panels_n; ++pn) {
      pack_b(g, b, k0, kc, n0 + pn * kNr, bp.data());
      for (int64_t pm = 0; pm < panels_m; ++pm)
        kernel(kc, ap.data() + pm * kc * kMr, bp.data(), tile.data() + pm * kMr * kNc + pn * kNr, kNc, k0 == 0);
    }
  }
  // Store: + bias, + C's old value, rounded once into C's dtype.
  float row[kNc];
  for (int64_t i = 0; i < mc; ++i) {
    const float* t = tile.data() + i * kNc;
    for (int64_t j = 0; j < nc; ++j) row[j] = t[j] + (bias ? bias[n0 + j] : 0.0f);
    const int64_t at = (m0 + i) * g.ldc + n0;
    if (g.tc == DType::BF16) {
      auto* out = static_cast<uint16_t*>(c) + at;
      if (accumulate)
        for (int64_t j = 0; j < nc; ++j) row[j] += bf16_to_f32(out[j]);
      vec::to_bf16(row, nc, out);
    } else {
      float* out = static_cast<float*>(c) + at;
      for (int64_t j = 0; j < nc; ++j) out[j] = accumulate ? out[j] + row[j] : row[j];
    }
  }
}

}  // namespace

PackedKernel best_packed_kernel() {
  static const PackedKernel k = cpu_features().avx2 && cpu_features().fma ? PackedKernel::kAvx2 : PackedKernel::kPortable;
  return k;
}

const char* packed_kernel_name(PackedKernel k) { return k == PackedKernel::kAvx2 ? "avx2" : "portable"; }

void PackedGemm::run(const void* a, const void* b, void* c, const float* bias, bool accumulate) const {
  for (DType t : {ta, tb, tc})
    if (t != DType::F32 && t != DType::BF16) fail("cpu backend: the packed GEMM takes f32 or bf16, not {}", dtype_name(t));
  MicroKernel kern = kernel_portable;
  PackB pack_b = pack_b_portable;
#if defined(__x86_64__)
  if (kernel == PackedKernel::kAvx2) {
    if (!(cpu_features().avx2 && cpu_features().fma)) fail("cpu backend: the avx2 GEMM kernel needs AVX2 and FMA, which this CPU lacks");
    kern = kernel_avx2, pack_b = pack_b_avx2;
  }
#endif
  const int64_t tasks_m = (M + kMc - 1) / kMc, tasks_n = (N + kNc - 1) / kNc, tasks = tasks_m * tasks_n;
  // Inside a parallel region (attention's tasks) each call runs on its caller's thread, as oneDNN's do.
#pragma omp parallel for schedule(dynamic) if (tasks > 1 && !omp_in_parallel())
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t m0 = t / tasks_n * kMc, n0 = t % tasks_n * kNc;
    run_task(*this, kern, pack_b, a, b, c, bias, accumulate, m0, std::min(kMc, M - m0), n0, std::min(kNc, N - n0));
  }
}

}  // namespace trl::cpu

// Streaming a decode GEMV's weight with and without software prefetch, in alternating passes in one process (a
// machine whose bandwidth drifts between runs still compares the variants fairly). The loops are those of
// src/backend/cpu/vec.cpp's row kernels (dot_bf16bf16 on AVX512-BF16, the widening dot_bf16 elsewhere), standalone
// so that both variants run on any CPU; the engine picks one by vendor (vec.cpp, prefetch_rows()).
//
//   g++ -O2 -fopenmp -mavx2 -mfma bench/row_stream.cpp -o /tmp/row_stream            # the AVX2 build of dot_bf16
//   g++ -O2 -fopenmp -march=x86-64-v4 -mavx512bf16 bench/row_stream.cpp -o /tmp/row_stream  # and vdpbf16ps
//   OMP_NUM_THREADS=2 /tmp/row_stream [PASSES=15] [K=2048]
//
// Prints the median and best GB/s of each variant over the passes: a 151936 x K bf16 weight (Qwen3's lm_head),
// 2 MB-aligned and madvised for huge pages as the engine's weights are.
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kAhead = 512;  // elements, as vec.cpp's kPrefetchAhead

float bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// vec.cpp's dot_bf16: f32 x, bf16 w widened in registers, 16 lanes, chunks of 256 with their prefetches first.
template <bool kPrefetch>
__attribute__((noinline)) float dot_widen(const float* x, const uint16_t* w, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n;) {
    if (kPrefetch)
      for (int64_t l = 0; l < 256; l += 32) __builtin_prefetch(w + i + l + kAhead, 0, 3);
    const int64_t end = i + 256 <= n ? i + 256 : n;
    for (; i + 16 <= end; i += 16)
      for (int k = 0; k < 16; ++k) acc[k] += x[i + k] * bf16(w[i + k]);
  }
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

#if defined(__AVX512BF16__)
// vec.cpp's dot_bf16bf16: bf16 x and w, four vdpbf16ps chains.
template <bool kPrefetch>
__attribute__((noinline)) float dot_bf16bf16(const uint16_t* x, const uint16_t* w, int64_t n) {
  auto ld = [](const uint16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); };
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 128 <= n; i += 128) {
    if (kPrefetch)
      for (int l = 0; l < 4; ++l) __builtin_prefetch(w + i + 32 * l + kAhead, 0, 3);
    a0 = _mm512_dpbf16_ps(a0, ld(x + i), ld(w + i));
    a1 = _mm512_dpbf16_ps(a1, ld(x + i + 32), ld(w + i + 32));
    a2 = _mm512_dpbf16_ps(a2, ld(x + i + 64), ld(w + i + 64));
    a3 = _mm512_dpbf16_ps(a3, ld(x + i + 96), ld(w + i + 96));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));  // (GCC 12 warns falsely inside _mm512_reduce_add_ps)
  float s = 0;
  for (float l : lanes) s += l;
  return s;
}
#endif

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int passes = argc > 1 ? std::max(1, std::atoi(argv[1])) : 15;
  const int64_t K = argc > 2 ? std::max(128, std::atoi(argv[2])) / 128 * 128 : 2048, N = 151936;
  const size_t bytes = static_cast<size_t>(N * K) * 2, huge = size_t{2} << 20;
  auto* w = static_cast<uint16_t*>(std::aligned_alloc(huge, (bytes + huge - 1) / huge * huge));
  if (w == nullptr) return std::fprintf(stderr, "row_stream: out of memory for %zu bytes\n", bytes), 1;
  madvise(w, bytes, MADV_HUGEPAGE);
  for (int64_t i = 0; i < N * K; ++i) w[i] = static_cast<uint16_t>(0x3f80 ^ (i & 0x7f));
  std::vector<float> xf(static_cast<size_t>(K), 1.0f), y(static_cast<size_t>(N));
  std::vector<uint16_t> x16(static_cast<size_t>(K), 0x3f80);
  // One pass: every weight row's dot product, the rows split between the threads as the engine's GEMV splits them.
  auto pass = [&](auto dot_row) {
    return [&, dot_row] {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) y[n] = dot_row(w + n * K);
    };
  };
  std::vector<std::pair<std::string, std::function<void()>>> variants = {
      {"widen, prefetch", pass([&](const uint16_t* row) { return dot_widen<true>(xf.data(), row, K); })},
      {"widen, no prefetch", pass([&](const uint16_t* row) { return dot_widen<false>(xf.data(), row, K); })},
#if defined(__AVX512BF16__)
      {"bf16 dot, prefetch", pass([&](const uint16_t* row) { return dot_bf16bf16<true>(x16.data(), row, K); })},
      {"bf16 dot, no prefetch", pass([&](const uint16_t* row) { return dot_bf16bf16<false>(x16.data(), row, K); })},
#endif
  };
  std::vector<std::vector<double>> rates(variants.size());
  for (int p = 0; p < passes; ++p)
    for (size_t v = 0; v < variants.size(); ++v) {
      const auto t0 = std::chrono::steady_clock::now();
      variants[v].second();
      rates[v].push_back(static_cast<double>(bytes) / seconds_since(t0) / 1e9);
    }
  std::printf("%d threads, weight 151936 x %lld bf16 (%.0f MB), %d passes\n", omp_get_max_threads(), static_cast<long long>(K), bytes / 1e6, passes);
  for (size_t v = 0; v < variants.size(); ++v) {
    std::sort(rates[v].begin(), rates[v].end());
    std::printf("%-22s median %5.1f GB/s  best %5.1f\n", variants[v].first.c_str(), rates[v][rates[v].size() / 2], rates[v].back());
  }
  return y[1] == 12345.0f ? 2 : 0;  // keeps the results live
}

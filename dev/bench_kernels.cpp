// Micro-benchmarks of the CPU backend's kernels on their own: the row kernels of src/backend/cpu/vec.h and the
// oneDNN GEMM wrapper (src/backend/cpu/gemm.h), at the shapes a Qwen3-0.6B layer uses (C = 1024, F = 3072, V chunk
// = 4096). The row kernels run on one thread; the GEMM on oneDNN's OpenMP threads (OMP_NUM_THREADS). Bytes/s count
// the operands read once; items/s are FLOP/s (2 per multiply-add) for the dot products and the GEMM.
//   build/dev/trl_bench_kernels --benchmark_filter=dot
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/vec.h"
#include "core/cpu_features.h"
#include "trl/core/dtype.h"

namespace {

using namespace trl;

std::vector<float> row(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = d(rng);
  return x;
}
std::vector<uint16_t> bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

// One decode GEMV row: x[K] f32 · w[K] bf16.
void BM_dot_bf16(benchmark::State& state) {
  const int64_t K = state.range(0);
  const auto x = row(K, 1);
  const auto w = bf16(row(K, 2));
  for (auto _ : state) benchmark::DoNotOptimize(cpu::vec::dot_bf16(x.data(), w.data(), K));
  state.SetBytesProcessed(state.iterations() * K * 2);
}
BENCHMARK(BM_dot_bf16)->Arg(1024)->Arg(3072);

// M rows against one bf16 weight row (batched decode), f32 and (AVX512-BF16) bf16 activations.
void BM_dots_bf16(benchmark::State& state) {
  const int64_t M = state.range(0), K = 1024;
  const auto x = row(M * K, 3);
  const auto w = bf16(row(K, 4));
  float out[8];
  for (auto _ : state) {
    cpu::vec::dots_bf16(x.data(), M, K, w.data(), out);
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * 2 * M * K);
}
BENCHMARK(BM_dots_bf16)->DenseRange(1, 8);

#if defined(__x86_64__)
void BM_dots_bf16bf16(benchmark::State& state) {
  if (!cpu_features().avx512bf16) {
    state.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  const int64_t M = state.range(0), K = 1024;
  const auto x = bf16(row(M * K, 5));
  const auto w = bf16(row(K, 6));
  float out[8];
  for (auto _ : state) {
    cpu::vec::dots_bf16bf16(x.data(), M, K, w.data(), out);
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * 2 * M * K);
}
BENCHMARK(BM_dots_bf16bf16)->DenseRange(1, 8);
#endif

// The softmax's exponentials over one vocabulary chunk.
void BM_exp_shift_sum(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto x0 = row(n, 7);
  auto x = x0;
  for (auto _ : state) {
    x = x0;
    benchmark::DoNotOptimize(cpu::vec::exp_shift_sum(x.data(), n, 4.0f));
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_exp_shift_sum)->Arg(4096);

void BM_round_to_bf16(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto x = row(n, 8);
  for (auto _ : state) {
    cpu::vec::round_to_bf16(x.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4);
}
BENCHMARK(BM_round_to_bf16)->Arg(4096);

// y[M, N] = x[M, K]·w[N, K]ᵀ in bf16 with f32 output (a projection of a 512-token prefill).
void BM_gemm_bf16(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const auto a = bf16(row(M * K, 9)), b = bf16(row(N * K, 10));
  std::vector<float> c(static_cast<size_t>(M * N));
  const cpu::Gemm gemm(M, N, K, DType::BF16, K, 1, DType::BF16, 1, K, DType::F32, false, false);
  for (auto _ : state) {
    gemm.run(a.data(), b.data(), c.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * gemm.flops());
}
BENCHMARK(BM_gemm_bf16)->Args({512, 1024, 1024})->Args({512, 3072, 1024})->Args({512, 4096, 1024});

}  // namespace

BENCHMARK_MAIN();

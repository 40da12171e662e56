// Micro-benchmarks of the CPU backend's kernels on their own: the row kernels of src/backend/cpu/vec.h and the
// oneDNN GEMM wrapper (src/backend/cpu/gemm.h), at the shapes a Qwen3-0.6B layer uses (C = 1024, F = 3072, V chunk
// = 4096). The row kernels run on one thread; the GEMM on oneDNN's OpenMP threads (OMP_NUM_THREADS). Bytes/s count
// the operands read once; items/s are FLOP/s (2 per multiply-add) for the dot products and the GEMM.
//   build/dev/trl_bench_kernels --benchmark_filter=dot
#include <benchmark/benchmark.h>

#include <omp.h>

#include <algorithm>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_packed.h"
#include "backend/cpu/amx.h"
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

// The AMX GEMV on OpenMP's threads (each a contiguous share of the weight rows, as gemv_node splits them): M rows
// of x against N weight rows of K = 1024; bytes = the weight's. N = 64 per thread stays in L2 (the tile unit's
// rate); N = 262144 is 512 MiB of weight per thread, streamed from memory: compare with BM_read.
void BM_amx_dots(benchmark::State& state) {
  if (!cpu_features().amx_bf16) {
    state.SkipWithError("no AMX-BF16 on this CPU (or TRL_NO_AMX)");
    return;
  }
  const int64_t M = state.range(0), N = state.range(1) * omp_get_max_threads(), K = 1024;
  const auto x = bf16(row(M * K, 5));
  std::vector<uint16_t> w(static_cast<size_t>(N * K), 0x3f80);
  std::vector<uint16_t> xp(cpu::amx::packed_x_size(M, K));
  cpu::amx::pack_x(x.data(), M, K, xp.data());
  for (auto _ : state) {
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num(), blocks = N / 16;
      const int64_t b0 = blocks * t / threads, b1 = blocks * (t + 1) / threads;
      alignas(64) float c[4 * 256];
      cpu::amx::TileScope tiles(M);
      for (int64_t b = b0; b < b1; b += 4) cpu::amx::dots(xp.data(), M, K, w.data() + b * 16 * K, std::min<int64_t>(4, b1 - b), c);
      benchmark::DoNotOptimize(c);
    }
  }
  state.SetBytesProcessed(state.iterations() * N * K * 2);
}
BENCHMARK(BM_amx_dots)->ArgsProduct({{1, 8, 16}, {64, 262144}})->UseRealTime();
// The vector kernels over the same streamed weight, one weight row per call (gemv_node without AMX).
void BM_dots_bf16bf16_stream(benchmark::State& state) {
  if (!cpu_features().avx512bf16) {
    state.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  const int64_t M = state.range(0), N = 262144 * omp_get_max_threads(), K = 1024;
  const auto x = bf16(row(M * K, 5));
  std::vector<uint16_t> w(static_cast<size_t>(N * K), 0x3f80);
  for (auto _ : state) {
#pragma omp parallel
    {
      float out[8];
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        cpu::vec::dots_bf16bf16(x.data(), M, K, w.data() + n * K, out);
        benchmark::DoNotOptimize(out);
      }
    }
  }
  state.SetBytesProcessed(state.iterations() * N * K * 2);
}
BENCHMARK(BM_dots_bf16bf16_stream)->Arg(1)->Arg(8)->UseRealTime();
// A plain read of 512 MiB per thread on OpenMP's threads: the bound of BM_amx_dots/M/262144.
void BM_read(benchmark::State& state) {
  const int64_t n = 262144 * 1024 / 2 * omp_get_max_threads();
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);
  for (auto _ : state) {
    double total = 0;
#pragma omp parallel reduction(+ : total)
    {
      float acc[16] = {};
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; i += 16)
        for (int64_t k = 0; k < 16; ++k) acc[k] += buf[static_cast<size_t>(i + k)];
      for (float v : acc) total += v;
    }
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(state.iterations() * n * 4);
}
BENCHMARK(BM_read)->UseRealTime();
// The same read as `trl bench generate` measures its bound: vec::sum (with its prefetch) over 64 KiB chunks.
void BM_read_vec_sum(benchmark::State& state) {
  const int64_t n = 262144 * 1024 / 2 * omp_get_max_threads(), chunk = 16384;
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);
  for (auto _ : state) {
    double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int64_t c = 0; c < n / chunk; ++c) total += cpu::vec::sum(buf.data() + c * chunk, chunk);
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(state.iterations() * n * 4);
}
BENCHMARK(BM_read_vec_sum)->UseRealTime();
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

// The same shapes in f32 on oneDNN: the GEMM peak the packed GEMM below is measured against.
void BM_gemm_f32(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const auto a = row(M * K, 9), b = row(N * K, 10);
  std::vector<float> c(static_cast<size_t>(M * N));
  const cpu::Gemm gemm(M, N, K, DType::F32, K, 1, DType::F32, 1, K, DType::F32, false, false);
  for (auto _ : state) {
    gemm.run(a.data(), b.data(), c.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * gemm.flops());
}
BENCHMARK(BM_gemm_f32)->Args({512, 1024, 1024})->Args({512, 3072, 1024})->Args({512, 1024, 3072});

// The backend's own GEMM (gemm_packed.h) on bf16 operands, as CPUs without AVX-512 run every bf16 GEMM: the weight
// in nn.Linear layout (forward, arg 3 = 0), row-major (dx = dy·w, 1), and the weight gradient dyᵀ·x (2).
void BM_gemm_packed_bf16(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2), layout = state.range(3);
  const auto a = bf16(row(M * K, 9)), b = bf16(row(N * K, 10));
  std::vector<float> c(static_cast<size_t>(M * N));
  cpu::PackedGemm g{M, N, K, DType::BF16, K, 1, DType::BF16, 1, K, DType::F32, N};
  if (layout == 1) g.sb_k = N, g.sb_n = 1;
  if (layout == 2) g.sa_m = 1, g.sa_k = M, g.sb_k = N, g.sb_n = 1;
  for (auto _ : state) {
    g.run(a.data(), b.data(), c.data(), nullptr, false);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * 2 * M * N * K);
  state.SetLabel(cpu::packed_kernel_name(g.kernel));
}
BENCHMARK(BM_gemm_packed_bf16)->Args({512, 1024, 1024, 0})->Args({512, 3072, 1024, 0})->Args({512, 1024, 3072, 0})->Args({512, 1024, 1024, 1})
    ->Args({1024, 1024, 512, 2});

}  // namespace

BENCHMARK_MAIN();

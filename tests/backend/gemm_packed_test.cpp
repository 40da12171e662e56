// The CPU backend's own GEMM (src/backend/cpu/gemm_packed.h), each micro-kernel family this CPU runs, against a
// plain double loop: every operand layout the backend's matmul ops use (row-major, column-major, nn.Linear weights,
// general strides), f32 and bf16 operands and results, bias and accumulation, and sizes around the 6×16 register
// tile and the 144×256×256 blocks. A comparison fails on NaN or Inf.
#include "backend/cpu/gemm_packed.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/gemm.h"
#include "core/cpu_features.h"
#include "trl/core/dtype.h"

namespace trl::cpu {
namespace {

// The micro-kernel families this CPU runs (a family it cannot run is skipped, and the test says so).
std::vector<PackedKernel> runnable_kernels() {
  std::vector<PackedKernel> k = {PackedKernel::kPortable};
  if (cpu_features().avx2 && cpu_features().fma) k.push_back(PackedKernel::kAvx2);
  else std::printf("[ skipped  ] the avx2 GEMM kernel: this CPU has no AVX2 + FMA\n");
  return k;
}

// A strided operand: `rows`×`cols` elements at (r·sr + c·sc) in a buffer of f32 values, and its bf16 bits.
struct Operand {
  int64_t sr = 0, sc = 0;
  DType dt = DType::F32;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  const void* data() const { return dt == DType::BF16 ? static_cast<const void*>(bf16.data()) : f32.data(); }
  double at(int64_t r, int64_t c) const {
    const int64_t i = r * sr + c * sc;
    return dt == DType::BF16 ? bf16_to_f32(bf16[static_cast<size_t>(i)]) : f32[static_cast<size_t>(i)];
  }
};

// layout: 0 row-major, 1 column-major, 2 both strides padded (every other element, rows of 3·cols + 1).
Operand make_operand(int64_t rows, int64_t cols, int layout, DType dt, uint32_t seed) {
  Operand o;
  o.dt = dt;
  if (layout == 0) o.sr = cols, o.sc = 1;
  if (layout == 1) o.sr = 1, o.sc = rows;
  if (layout == 2) o.sr = 2 * cols + 1, o.sc = 2;
  const int64_t size = layout == 2 ? rows * o.sr + 1 : rows * cols;
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  o.f32.resize(static_cast<size_t>(std::max<int64_t>(size, 1)));
  for (float& v : o.f32) v = d(rng);
  for (float v : o.f32) o.bf16.push_back(f32_to_bf16(v));
  return o;
}

struct Case {
  int64_t M, N, K;
  int la, lb;  // layouts of A and B
  DType ta, tb, tc;
  bool bias, accumulate;
  std::string name() const {
    return fmt::format("M={} N={} K={} A layout {} {} B layout {} {} -> {}{}{}", M, N, K, la, dtype_name(ta), lb, dtype_name(tb), dtype_name(tc),
                       bias ? " +bias" : "", accumulate ? " +=" : "");
  }
};

// Runs one case on `kernel` and compares every element with the double loop: f32 results within f32 summation
// error (a few ulps of Σ|a·b| per √K), bf16 results within one bf16 rounding of that.
void check(const Case& t, PackedKernel kernel) {
  SCOPED_TRACE(t.name() + " on " + packed_kernel_name(kernel));
  const Operand a = make_operand(t.M, t.K, t.la, t.ta, 1), b = make_operand(t.K, t.N, t.lb, t.tb, 2);
  std::vector<float> bias(static_cast<size_t>(t.N));
  for (int64_t n = 0; n < t.N; ++n) bias[static_cast<size_t>(n)] = 0.25f * static_cast<float>(n % 7) - 0.5f;
  const int64_t ldc = t.N + 3;  // a row stride wider than the row
  std::vector<float> c32(static_cast<size_t>(t.M * ldc));
  for (size_t i = 0; i < c32.size(); ++i) c32[i] = round_bf16(0.5f * std::sin(static_cast<float>(i)));
  std::vector<uint16_t> c16(c32.size());
  for (size_t i = 0; i < c32.size(); ++i) c16[i] = f32_to_bf16(c32[i]);
  const std::vector<float> old = c32;

  PackedGemm g{t.M, t.N, t.K, t.ta, a.sr, a.sc, t.tb, b.sr, b.sc, t.tc, ldc, kernel};
  g.run(a.data(), b.data(), t.tc == DType::BF16 ? static_cast<void*>(c16.data()) : c32.data(), t.bias ? bias.data() : nullptr, t.accumulate);

  int bad = 0;
  for (int64_t m = 0; m < t.M; ++m)
    for (int64_t n = 0; n < ldc; ++n) {
      const size_t i = static_cast<size_t>(m * ldc + n);
      const double got = t.tc == DType::BF16 ? bf16_to_f32(c16[i]) : c32[i];
      if (n >= t.N) {  // past the row: untouched
        if (got != old[i]) ++bad, ADD_FAILURE() << "wrote past the row at (" << m << ", " << n << ")";
        continue;
      }
      double want = 0, mag = 0;
      for (int64_t k = 0; k < t.K; ++k) want += a.at(m, k) * b.at(k, n), mag += std::fabs(a.at(m, k) * b.at(k, n));
      if (t.bias) want += bias[static_cast<size_t>(n)], mag += std::fabs(bias[static_cast<size_t>(n)]);
      if (t.accumulate) want += old[i], mag += std::fabs(old[i]);
      double tol = 4e-7 * mag * std::sqrt(static_cast<double>(t.K) + 1) + 1e-30;
      if (t.tc == DType::BF16) tol += std::fabs(want) * std::ldexp(1.0, -8);
      if (!(std::isfinite(got) && std::fabs(got - want) <= tol) && ++bad <= 5)
        ADD_FAILURE() << "(" << m << ", " << n << "): got " << got << ", want " << want << " (tolerance " << tol << ")";
    }
  EXPECT_EQ(bad, 0);
}

TEST(CpuPackedGemm, EveryLayoutAndDtypeMatchesADoubleLoop) {
  for (PackedKernel kernel : runnable_kernels())
    for (int la : {0, 1, 2})
      for (int lb : {0, 1, 2})
        for (DType ta : {DType::F32, DType::BF16})
          for (DType tb : {DType::F32, DType::BF16})
            for (DType tc : {DType::F32, DType::BF16}) check({13, 37, 45, la, lb, ta, tb, tc, (la + lb) % 2 == 1, la == lb}, kernel);
}

// Sizes around the register tile (6×16), the K block (256) and the task tile (144 rows, 256 columns), including
// K = 0 (C = bias + old C) and single rows and columns.
TEST(CpuPackedGemm, SizesAroundTheTileAndBlockEdgesMatchADoubleLoop) {
  const std::vector<std::vector<int64_t>> sizes = {{1, 1, 1},    {6, 16, 8},    {7, 17, 9},   {5, 15, 7},    {1, 300, 64}, {300, 1, 64},
                                                   {145, 257, 3}, {144, 256, 256}, {12, 32, 257}, {20, 40, 600}, {3, 5, 0},   {145, 257, 257}};
  for (PackedKernel kernel : runnable_kernels())
    for (const auto& s : sizes)
      for (int lb : {0, 1}) {
        check({s[0], s[1], s[2], 0, lb, DType::BF16, DType::BF16, DType::BF16, s[2] == 0, false}, kernel);
        check({s[0], s[1], s[2], 0, lb, DType::BF16, DType::BF16, DType::F32, false, s[2] == 0}, kernel);
      }
}

// Non-finite inputs propagate as IEEE arithmetic says: an Inf in A makes its row Inf or NaN, never a finite value.
TEST(CpuPackedGemm, InfAndNanPropagate) {
  for (PackedKernel kernel : runnable_kernels()) {
    const int64_t M = 7, N = 17, K = 9;
    std::vector<float> a(static_cast<size_t>(M * K), 1.0f), b(static_cast<size_t>(K * N), 1.0f), c(static_cast<size_t>(M * N), 0.0f);
    a[2 * K + 3] = INFINITY;
    b[4 * N + 5] = NAN;
    PackedGemm{M, N, K, DType::F32, K, 1, DType::F32, N, 1, DType::F32, N, kernel}.run(a.data(), b.data(), c.data(), nullptr, false);
    for (int64_t n = 0; n < N; ++n) EXPECT_FALSE(std::isfinite(c[static_cast<size_t>(2 * N + n)])) << packed_kernel_name(kernel) << " column " << n;
    for (int64_t m = 0; m < M; ++m) EXPECT_TRUE(std::isnan(c[static_cast<size_t>(m * N + 5)])) << packed_kernel_name(kernel) << " row " << m;
    EXPECT_EQ(c[0], static_cast<float>(K)) << packed_kernel_name(kernel);
  }
}

// Gemm takes the packed GEMM where oneDNN has no matmul for the types (f32 x bf16 has none), and says so.
TEST(CpuPackedGemm, GemmChoosesItWhereOneDnnHasNoPrimitive) {
  const Gemm mixed(4, 8, 16, DType::F32, 16, 1, DType::BF16, 1, 16, DType::F32, false, false);
  EXPECT_EQ(std::string(mixed.kernel()), packed_kernel_name(best_packed_kernel()));
  std::vector<float> a(64, 0.5f), c(32, -1.0f);
  std::vector<uint16_t> b(128, f32_to_bf16(2.0f));
  mixed.run(a.data(), b.data(), c.data());
  for (float v : c) EXPECT_EQ(v, 16.0f);
  const Gemm f32(4, 8, 16, DType::F32, 16, 1, DType::F32, 1, 16, DType::F32, false, false);
  EXPECT_EQ(std::string(f32.kernel()), "onednn");
}

}  // namespace
}  // namespace trl::cpu

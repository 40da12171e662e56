// The CPU backend's row kernels (src/backend/cpu/vec.h), each on its own against a plain double loop, at lengths
// around the 16- and 32-lane loop boundaries. Every comparison checks finiteness first (a NaN never passes).
#include "backend/cpu/vec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/amx.h"
#include "core/cpu_features.h"
#include "trl/core/dtype.h"

namespace trl::cpu {
namespace {

const std::vector<int64_t> kLengths = {1, 7, 15, 16, 17, 31, 32, 33, 64, 127, 128, 129, 1000};

std::vector<float> random_row(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = d(rng);
  return x;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

// |got - want| <= tol·max(1, |want|), with both finite.
::testing::AssertionResult close(double got, double want, double tol) {
  if (!std::isfinite(got) || !std::isfinite(want)) return ::testing::AssertionFailure() << "not finite: got " << got << ", want " << want;
  if (std::fabs(got - want) > tol * std::max(1.0, std::fabs(want)))
    return ::testing::AssertionFailure() << "got " << got << ", want " << want << " (tolerance " << tol << ")";
  return ::testing::AssertionSuccess();
}

TEST(Vec, DotProductsMatchDoubleLoops) {
  for (int64_t n : kLengths) {
    const auto a = random_row(n, 1), b = random_row(n, 2);
    const auto b16 = to_bf16(b);
    double want = 0, want16 = 0;
    for (int64_t i = 0; i < n; ++i) want += static_cast<double>(a[i]) * b[i], want16 += static_cast<double>(a[i]) * bf16_to_f32(b16[i]);
    EXPECT_TRUE(close(vec::dot(a.data(), b.data(), n), want, 1e-5)) << "dot n=" << n;
    EXPECT_TRUE(close(vec::dot_bf16(a.data(), b16.data(), n), want16, 1e-5)) << "dot_bf16 n=" << n;
    double s = 0;
    for (float v : a) s += v;
    EXPECT_TRUE(close(vec::sum(a.data(), n), s, 1e-5)) << "sum n=" << n;
  }
}

TEST(Vec, MultiRowDotsReadTheWeightOnceAndMatchEachRow) {
  for (int64_t K : {1, 16, 33, 129, 1024}) {
    for (int64_t M = 1; M <= 8; ++M) {
      const auto x = random_row(M * K, 3), w = random_row(K, 4);
      const auto w16 = to_bf16(w), x16 = to_bf16(x);
      std::vector<float> out(8, NAN), out16(8, NAN);
      vec::dots_bf16(x.data(), M, K, w16.data(), out.data());
#if defined(__x86_64__)
      const bool bf16 = cpu_features().avx512bf16;
      if (bf16) vec::dots_bf16bf16(x16.data(), M, K, w16.data(), out16.data());
#else
      const bool bf16 = false;
#endif
      for (int64_t m = 0; m < M; ++m) {
        double want = 0, want16 = 0;
        for (int64_t k = 0; k < K; ++k) {
          want += static_cast<double>(x[m * K + k]) * bf16_to_f32(w16[k]);
          want16 += static_cast<double>(bf16_to_f32(x16[m * K + k])) * bf16_to_f32(w16[k]);
        }
        EXPECT_TRUE(close(out[m], want, 1e-5)) << "dots_bf16 M=" << M << " K=" << K << " row " << m;
        if (bf16) {
          EXPECT_TRUE(close(out16[m], want16, 1e-5)) << "dots_bf16bf16 M=" << M << " K=" << K << " row " << m;
        }
      }
    }
  }
}

// The AMX GEMV's blocks (amx.h) against double loops: M = 1..16 rows of x, 1..9 blocks of 16 weight rows (the
// four-at-a-time loop and the single blocks), K = 32 and 96 (whole k-blocks: the tail is the caller's).
TEST(Vec, AmxTileDotsMatchDoubleLoops) {
  if (!cpu_features().amx_bf16) GTEST_SKIP() << "no AMX-BF16 on this CPU (or TRL_NO_AMX)";
  for (int64_t K : {32, 96})
    for (int64_t M = 1; M <= amx::kMaxRows; ++M)
      for (int64_t blocks : {1, 4, 5, 9}) {
        const auto x16 = to_bf16(random_row(M * K, 11)), w16 = to_bf16(random_row(blocks * 16 * K, 12));
        std::vector<uint16_t> xp(amx::packed_x_size(M, K));
        amx::pack_x(x16.data(), M, K, xp.data());
        std::vector<float> c(static_cast<size_t>(blocks * 256), NAN);
        {
          amx::TileScope tiles(M);
          amx::dots(xp.data(), M, K, w16.data(), blocks, c.data());
        }
        for (int64_t r = 0; r < blocks * 16; ++r)
          for (int64_t m = 0; m < M; ++m) {
            double want = 0;
            for (int64_t k = 0; k < K; ++k) want += static_cast<double>(bf16_to_f32(x16[m * K + k])) * bf16_to_f32(w16[r * K + k]);
            ASSERT_TRUE(close(c[r * 16 + m], want, 1e-5)) << "M=" << M << " K=" << K << " blocks=" << blocks << " row " << r << " x row " << m;
          }
      }
}

// The exponentials' edges: far below the maximum (e^-90 is below f32's normal range: 0 or a tiny value), -inf (0),
// and a NaN (stays NaN), at every position of a 16-lane group and in the tail.
TEST(Vec, ExponentialsAtTheEdges) {
  for (int64_t n : {5, 16, 21}) {
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> x(static_cast<size_t>(n), 0.5f);
      x[at] = -90.0f;
      if (at + 1 < n) x[at + 1] = -INFINITY;
      vec::exp_shift(x.data(), n, 0.5f);
      ASSERT_TRUE(x[at] >= 0.0f && x[at] < 1e-38f) << "n=" << n << " at " << at << ": " << x[at];
      if (at + 1 < n) {
        ASSERT_EQ(x[at + 1], 0.0f);
      }
      for (int64_t i = 0; i < n; ++i)
        if (i != at && i != at + 1) {
          ASSERT_EQ(x[i], 1.0f) << "e^0, n=" << n << " i=" << i;
        }
      std::vector<float> y(static_cast<size_t>(n), 0.0f);
      y[at] = NAN;
      EXPECT_TRUE(std::isnan(vec::exp_shift_sum(y.data(), n, 0.0f))) << "a NaN reaches the sum, n=" << n;
      ASSERT_TRUE(std::isnan(y[at])) << "n=" << n << " at " << at;
      for (int64_t i = 0; i < n; ++i)
        if (i != at) {
          ASSERT_EQ(y[i], 1.0f) << "n=" << n << " i=" << i;
        }
    }
  }
}

// The family follows the CPU (and TRL_NO_AVX512), and an element's result never depends on the row's length: the
// tails run through the same lanes as padded copies.
TEST(Vec, ExponentialsAndBf16SwigluAreTheSameBitsAtEveryLength) {
  const CpuFeatures& f = cpu_features();
  EXPECT_STREQ(vec::exp_kernel(), f.avx512f ? "avx512" : f.avx2 && f.fma ? "avx2" : "portable");
  const auto x = random_row(40, 21, 3.0f);
  std::vector<float> whole = x;
  vec::exp_shift(whole.data(), 40, 9.0f);
  const auto g = to_bf16(random_row(40, 22, 3.0f)), u = to_bf16(random_row(40, 23)), dy = to_bf16(random_row(40, 24));
  std::vector<uint16_t> s40(40), dg40(40), du40(40);
  if (vec::swiglu_bf16_available()) {
    vec::swiglu_bf16(g.data(), u.data(), 40, s40.data());
    vec::swiglu_backward_bf16(g.data(), u.data(), dy.data(), 40, dg40.data(), du40.data());
  }
  for (int64_t n = 1; n < 40; ++n) {
    std::vector<float> part(x.begin(), x.begin() + n);
    vec::exp_shift(part.data(), n, 9.0f);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(std::memcmp(&part[i], &whole[i], 4), 0) << "exp, n=" << n << " i=" << i;
    if (!vec::swiglu_bf16_available()) continue;
    std::vector<uint16_t> s(n), dg(n), du(n);
    vec::swiglu_bf16(g.data(), u.data(), n, s.data());
    vec::swiglu_backward_bf16(g.data(), u.data(), dy.data(), n, dg.data(), du.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(s[i], s40[i]) << "swiglu, n=" << n << " i=" << i;
      ASSERT_EQ(dg[i], dg40[i]) << "swiglu dg, n=" << n << " i=" << i;
      ASSERT_EQ(du[i], du40[i]) << "swiglu du, n=" << n << " i=" << i;
    }
  }
}

TEST(Vec, ScaledBf16CastRoundsOnce) {
  for (int64_t n : kLengths) {
    auto x = random_row(n, 13, 3.0f);
    if (n > 2) x[1] = NAN, x[2] = INFINITY;
    std::vector<uint16_t> out(static_cast<size_t>(n));
    vec::scale_to_bf16(x.data(), n, -0.37f, out.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], f32_to_bf16(-0.37f * x[i])) << "n=" << n << " i=" << i;
  }
}

TEST(Vec, ExponentialsAndTheirSums) {
  for (int64_t n : kLengths) {
    auto x = random_row(n, 5, 4.0f);
    if (n > 1) x[0] = -INFINITY;  // a masked score gives exactly 0 (a row of only masked scores: callers skip it)
    float mx = -INFINITY;
    for (float v : x) mx = std::max(mx, v);
    std::vector<double> e(x.size());
    double s = 0, sy = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      e[i] = std::exp(static_cast<double>(x[i]) - mx);
      s += e[i];
      if (std::isfinite(x[i])) sy += e[i] * (static_cast<double>(x[i]) - mx);
    }
    auto y = x;
    vec::exp_shift(y.data(), n, mx);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(close(y[i], e[i], 1e-6)) << "exp_shift n=" << n << " i=" << i;
    y = x;
    EXPECT_TRUE(close(vec::exp_shift_sum(y.data(), n, mx), s, 1e-5)) << "exp_shift_sum n=" << n;
    y = x;
    float ey = NAN;
    EXPECT_TRUE(close(vec::exp_shift_sum_ey(y.data(), n, mx, &ey), s, 1e-5)) << "exp_shift_sum_ey n=" << n;
    EXPECT_TRUE(close(ey, sy, 1e-5)) << "exp_shift_sum_ey's Σ e·(x - m), n=" << n;
    if (n > 1) {
      EXPECT_EQ(y[0], 0.0f);
    }
  }
}

TEST(Vec, Bf16RoundingIsNearestEvenAndKeepsNaN) {
  std::vector<float> x = {1.0f, 1.00390625f, 1.01171875f, -2.5f, 3.0e38f, -0.0f, NAN, INFINITY};
  for (float v : random_row(100, 6)) x.push_back(v);
  auto y = x;
  vec::round_to_bf16(y.data(), static_cast<int64_t>(y.size()));
  std::vector<uint16_t> bits(x.size());
  vec::bf16_bits(y.data(), static_cast<int64_t>(y.size()), bits.data());
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
      continue;
    }
    EXPECT_EQ(y[i], round_bf16(x[i])) << "x = " << x[i];
    EXPECT_EQ(bits[i], f32_to_bf16(x[i])) << "x = " << x[i];
  }
}

TEST(Vec, SoftmaxPieces) {
  for (int64_t n : kLengths) {
    // attention_scores: scale, mask by segment, return the maximum.
    auto x = random_row(n, 7);
    std::vector<int32_t> seg(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) seg[i] = i % 3 == 0 ? 2 : 1;
    auto y = x;
    const float mx = vec::attention_scores(y.data(), n, 0.5f, false, seg.data(), 1);
    float want_mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      const float want = seg[i] == 1 ? x[i] * 0.5f : -INFINITY;
      ASSERT_EQ(y[i], want) << "attention_scores n=" << n << " i=" << i;
      want_mx = std::max(want_mx, want);
    }
    EXPECT_EQ(mx, want_mx);
    // softmax_backward_row: d ← p∘(d − p·d)·scale.
    const auto p = random_row(n, 8), d0 = random_row(n, 9);
    auto d = d0;
    std::vector<uint16_t> d16(static_cast<size_t>(n));
    vec::softmax_backward_row(p.data(), d.data(), n, 0.25f, d16.data());
    double pd = 0;
    for (int64_t i = 0; i < n; ++i) pd += static_cast<double>(p[i]) * d0[i];
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(close(d[i], p[i] * (d0[i] - pd) * 0.25, 1e-5)) << "softmax_backward_row n=" << n << " i=" << i;
      ASSERT_EQ(d16[i], f32_to_bf16(d[i]));
    }
    // scale_round and axpy_bf16.
    auto z = x;
    vec::scale_round(z.data(), n, 3.0f, true, nullptr);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(z[i], round_bf16(x[i] * 3.0f));
    auto acc = x;
    const auto v16 = to_bf16(p);
    vec::axpy_bf16(acc.data(), 0.5f, v16.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(close(acc[i], x[i] + 0.5 * bf16_to_f32(v16[i]), 1e-6));
  }
}

}  // namespace
}  // namespace trl::cpu

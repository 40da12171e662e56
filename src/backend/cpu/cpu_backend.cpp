// The CPU backend: a graph traced for one shape is compiled once into a program whose buffers are planned into one
// arena (liveness-based), whose GEMMs are oneDNN matmul primitives created at compile time (bf16/f32 inputs, f32
// accumulation), and whose other ops are f32 loops parallelised with OpenMP — the runtime oneDNN itself uses, so
// the two never oversubscribe the cores. Running a program allocates nothing.
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include <dnnl.hpp>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/elementwise.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "graph/passes.h"
#include "runtime/runtime.h"

namespace trl {

namespace {

using graph::Graph;
using graph::kNone;
using graph::Node;
using graph::Op;

inline float ld(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F64: return static_cast<float>(static_cast<const double*>(p)[i]);
    case DType::I32: return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case DType::I64: return static_cast<float>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}
inline void st(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    default: break;
  }
}
// The value storing `v` in `dt` keeps (the rounding points of Transformers' eager model, as in the reference).
inline float rnd(DType dt, float v) {
  if (dt == DType::BF16) return round_bf16(v);
  if (dt == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

}  // namespace

float cpu::load_any(const void* p, DType dt, int64_t i) { return ld(p, dt, i); }
void cpu::store_any(void* p, DType dt, int64_t i, float v) { st(p, dt, i, v); }

namespace {

using cpu::dispatch;

dnnl::memory::data_type dnnl_type(DType dt) {
  switch (dt) {
    case DType::F32: return dnnl::memory::data_type::f32;
    case DType::BF16: return dnnl::memory::data_type::bf16;
    case DType::F16: return dnnl::memory::data_type::f16;
    default: fail("cpu backend: no oneDNN type for {}", dtype_name(dt));
  }
}

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};
Engine& engine() {
  static Engine e;
  return e;
}

// C[M,N] (+)= op(A)·op(B) with A, B given by strides, as one oneDNN matmul primitive fixed at compile time.
// On a CPU where oneDNN has no bf16 matmul (no AVX-512: oneDNN 2.6 needs it for bf16), the GEMM widens its bf16
// operands to f32 per call and runs an f32 primitive instead: same results up to f32 summation order, slower.
class Gemm {
 public:
  // a: M×K with strides (sa_m, sa_k); b: K×N with strides (sb_k, sb_n); c: M×N with row stride ldc (0 = N).
  // Optional bias [N] f32.
  Gemm(int64_t M, int64_t N, int64_t K, DType ta, int64_t sa_m, int64_t sa_k, DType tb, int64_t sb_k, int64_t sb_n, DType tc, bool bias,
       bool accumulate, int64_t ldc = 0)
      : M_(M), N_(N), K_(K), sa_m_(sa_m), sa_k_(sa_k), sb_k_(sb_k), sb_n_(sb_n), ldc_(ldc == 0 ? N : ldc), ta_(ta), tb_(tb), tc_(tc) {
    if (!create(ta, sa_m, sa_k, tb, sb_k, sb_n, tc, ldc_, bias, accumulate)) {
      if (accumulate && tc != DType::F32) fail("cpu backend: no oneDNN matmul for {}x{} accumulating into {}", dtype_name(ta), dtype_name(tb), dtype_name(tc));
      widen_a_ = ta != DType::F32, widen_b_ = tb != DType::F32, widen_c_ = tc != DType::F32;
      if (!create(DType::F32, widen_a_ ? K : sa_m, widen_a_ ? 1 : sa_k, DType::F32, widen_b_ ? N : sb_k, widen_b_ ? 1 : sb_n, DType::F32,
                  widen_c_ ? N : ldc_, bias, accumulate))
        fail("cpu backend: oneDNN has no f32 matmul for [{}, {}] x [{}, {}] on this CPU", M, K, K, N);
    }
    has_bias_ = bias;
  }
  // Safe to call from several threads at once: each thread executes on its own oneDNN stream.
  void run(const void* a, const void* b, void* c, const void* bias = nullptr) const {
    Engine& e = engine();
    thread_local dnnl::stream stream(e.engine);
    thread_local std::vector<float> wa, wb, wc;
    if (widen_a_) a = widen(a, ta_, M_, K_, sa_m_, sa_k_, wa);
    if (widen_b_) b = widen(b, tb_, K_, N_, sb_k_, sb_n_, wb);
    void* cc = c;
    if (widen_c_) {
      wc.resize(static_cast<size_t>(M_ * N_));
      cc = wc.data();
    }
    std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, dnnl::memory(a_, e.engine, const_cast<void*>(a))},
                                                  {DNNL_ARG_WEIGHTS, dnnl::memory(b_, e.engine, const_cast<void*>(b))},
                                                  {DNNL_ARG_DST, dnnl::memory(c_, e.engine, cc)}};
    if (has_bias_) args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_, e.engine, const_cast<void*>(bias)));
    thread_local std::vector<char> scratch;
    if (scratch.size() < scratch_md_.get_size()) scratch.resize(scratch_md_.get_size());
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratch_md_, e.engine, scratch.data()));
    prim_.execute(stream, args);
    stream.wait();
    if (widen_c_)
      for (int64_t m = 0; m < M_; ++m)
        for (int64_t n = 0; n < N_; ++n) st(c, tc_, m * ldc_ + n, wc[static_cast<size_t>(m * N_ + n)]);
  }

 private:
  // Creates (or finds) the primitive; false when oneDNN has none for these types on this CPU.
  bool create(DType ta, int64_t sa_m, int64_t sa_k, DType tb, int64_t sb_k, int64_t sb_n, DType tc, int64_t ldc, bool bias, bool accumulate) {
    using md = dnnl::memory::desc;
    a_ = md({M_, K_}, dnnl_type(ta), {sa_m, sa_k});
    b_ = md({K_, N_}, dnnl_type(tb), {sb_k, sb_n});
    c_ = md({M_, N_}, dnnl_type(tc), {ldc, 1});
    if (bias) bias_ = md({1, N_}, dnnl::memory::data_type::f32, {N_, 1});
    dnnl::primitive_attr attr;
    // User-managed scratchpad: the same primitive may run on several threads at once (attention tasks), which
    // oneDNN allows only when each execution brings its own scratchpad.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    // Layers of the same shape share one primitive: a 28-layer model needs ~20 distinct GEMMs, not 600.
    static std::mutex mu;
    static std::map<std::vector<int64_t>, std::pair<dnnl::matmul, dnnl::memory::desc>> cache;
    const std::vector<int64_t> key = {M_, N_, K_, static_cast<int64_t>(ta), sa_m, sa_k, static_cast<int64_t>(tb), sb_k, sb_n,
                                      static_cast<int64_t>(tc), bias, accumulate, ldc};
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it == cache.end()) {
      try {
        const auto d = bias ? dnnl::matmul::desc(a_, b_, bias_, c_) : dnnl::matmul::desc(a_, b_, c_);
        const dnnl::matmul::primitive_desc pd(d, attr, engine().engine);
        it = cache.emplace(key, std::make_pair(dnnl::matmul(pd), pd.scratchpad_desc())).first;
      } catch (const dnnl::error&) {
        return false;
      }
    }
    prim_ = it->second.first;
    scratch_md_ = it->second.second;
    return true;
  }
  // x: rows×cols in `dt` with strides (s_r, s_c) → contiguous f32 in buf.
  static const float* widen(const void* x, DType dt, int64_t rows, int64_t cols, int64_t s_r, int64_t s_c, std::vector<float>& buf) {
    buf.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) buf[static_cast<size_t>(r * cols + c)] = ld(x, dt, r * s_r + c * s_c);
    return buf.data();
  }

  int64_t M_, N_, K_, sa_m_, sa_k_, sb_k_, sb_n_, ldc_;
  DType ta_, tb_, tc_;
  bool widen_a_ = false, widen_b_ = false, widen_c_ = false;
  dnnl::memory::desc a_, b_, c_, bias_, scratch_md_;
  dnnl::matmul prim_;
  bool has_bias_ = false;
};

// Σ x² over n elements from `base`, in double, eight lanes (vectorisable without reassociating a single sum).
template <class A>
double sum_squares(const A& x, int64_t base, int64_t n) {
  double acc[8] = {};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int k = 0; k < 8; ++k) {
      const double v = x.ld(base + c + k);
      acc[k] += v * v;
    }
  for (; c < n; ++c) {
    const double v = x.ld(base + c);
    acc[0] += v * v;
  }
  double s = 0;
  for (double a : acc) s += a;
  return s;
}

// Hot inner loops (reductions GCC will not vectorise on its own), compiled for AVX-512, AVX2 and the x86-64 baseline; the loader picks one at run time (GCC
// target_clones), so the binary runs anywhere and never needs -march=native.
namespace kernels {
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
      if (kEy) acc2[k] += e * v;
    }
  float s = 0, s2 = 0;
  for (int k = 0; k < 16; ++k) s += acc[k], s2 += acc2[k];
  for (; i < n; ++i) {
    const float v = x[i] - shift, e = exp_nonpositive(v);
    x[i] = e;
    s += e;
    if (kEy) s2 += e * v;
  }
  if (kEy) *ey = s2;
  return s;
}
TRL_MULTIVERSION float exp_shift_sum(float* x, int64_t n, float shift) { return exp_shift_sum_impl<false>(x, n, shift, nullptr); }
TRL_MULTIVERSION float exp_shift_sum_ey(float* x, int64_t n, float shift, float* ey) { return exp_shift_sum_impl<true>(x, n, shift, ey); }
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
template <int M>
__attribute__((target("avx512f,avx512bf16"))) void dots_bf16bf16_impl(const uint16_t* x, int64_t K, const uint16_t* w, float* out) {
  __m512 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= K; i += 32) {
    const __m512bh wv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + i));
    for (int m = 0; m < M; ++m) acc[m] = _mm512_dpbf16_ps(acc[m], reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + m * K + i)), wv);
  }
  for (int m = 0; m < M; ++m) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[m]);
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
}  // namespace kernels

constexpr int64_t kVocabChunk = 4096;  // token_logprobs works on [rows, 4096] logits at a time

// The memory a program's planned buffers live in: owned by one program, or shared by all programs of a backend
// (CpuBackendOptions::share_arena) and grown to the largest. A program rebinds its buffers when `version` moved.
struct Arena {
  Tensor buffer;
  std::shared_ptr<const void> keepalive;  // held by output views, so a replaced buffer outlives the views into it
  size_t bytes = 0;
  uint64_t version = 0;
  void reserve(size_t need) {
    if (keepalive && bytes >= need) return;
    // The old buffer is let go first (it is freed as soon as no output view holds it), so that growing never holds
    // both. If the new one cannot be had, the arena is left empty with a new version: no program runs on the
    // released buffer, and the next run() reserves what it needs again.
    buffer = Tensor();
    keepalive.reset();
    bytes = 0;
    ++version;
    buffer = Tensor::uninitialized(DType::I32, {static_cast<int64_t>((need + 3) / 4 + 16)});
    keepalive = std::make_shared<Tensor>(buffer);
    bytes = need;
    ++version;
  }
};

class CpuProgram final : public Program {
 public:
  CpuProgram(const Graph& g, ProgramStats* stats, std::shared_ptr<Arena> arena, const std::string* cached_plan = nullptr, bool* used = nullptr)
      : g_(g), arena_(arena ? std::move(arena) : std::make_shared<Arena>()) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool reused = cached_plan != nullptr && load_plan(*cached_plan);
    if (used) *used = reused;
    if (!reused) plan();
    allocate();
    for (size_t i = 0; i < g_.nodes.size(); ++i) kernels_.push_back(lower(static_cast<graph::ValueId>(i)));
    if (scratch_bytes_ > 0) {  // lowering asked for scratch: the arena grows past the planned buffers
      arena_->reserve(arena_bytes_ + scratch_bytes_);
      bind_arena();
    }
    if (stats) {
      stats->arena_bytes = arena_bytes_ + scratch_bytes_;
      stats->compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }

  std::vector<Tensor> run(const TensorMap& inputs) override {
    const std::vector<Tensor> bound = bind_inputs(g_, inputs);
    arena_->reserve(arena_bytes_ + scratch_bytes_);  // a no-op unless an allocation failed since this program was made
    if (bound_version_ != arena_->version) bind_arena();
    for (size_t i = 0; i < g_.inputs.size(); ++i) ptr_[static_cast<size_t>(g_.inputs[i])] = const_cast<void*>(bound[i].data());
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      if (n.op == Op::Reshape || n.op == Op::View) {
        ptr_[i] = static_cast<char*>(ptr_[static_cast<size_t>(n.inputs[0])]) + (n.op == Op::View ? n.attrs.offset * static_cast<int64_t>(dtype_size(n.dtype)) : 0);
      } else if (inplace_[i]) {
        ptr_[i] = ptr_[static_cast<size_t>(n.inputs[2])];
      } else if (n.op == Op::KvCacheWrite) {  // the static cache is updated in the bound tensor itself
        ptr_[i] = ptr_[static_cast<size_t>(n.inputs[0])];
      }
      if (kernels_[i]) {
        if (check_guards_) fill_guard(i);
        const auto t0 = profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
        kernels_[i]();
        if (profile_) op_seconds_[static_cast<size_t>(n.op)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (check_guards_) verify_guard(i);
      }
    }
    // Outputs are views into the arena (no copy): valid until this program runs again (clone() to keep one).
    return outputs(bound);
  }
  size_t arena_bytes() const override { return arena_bytes_ + scratch_bytes_; }

 private:
  std::vector<Tensor> outputs(const std::vector<Tensor>& bound) {
    std::vector<Tensor> out;
    for (graph::ValueId v : g_.outputs) {
      const Node& n = g_.node(v);
      if (n.op == Op::Input) {
        out.push_back(bound[static_cast<size_t>(std::find(g_.inputs.begin(), g_.inputs.end(), v) - g_.inputs.begin())]);
        continue;
      }
      out.push_back(Tensor::view(ptr_[static_cast<size_t>(v)], n.dtype, n.shape, arena_->keepalive, StorageKind::View));
    }
    return out;
  }

 private:
  // ---- memory planning: one arena, first-fit reuse of buffers whose last reader has run ----
  void plan() {
    const size_t n = g_.nodes.size();
    ptr_.assign(n, nullptr);
    std::vector<size_t> root(n), last(n, 0);
    inplace_.assign(n, false);
    auto liveness = [&] {
      for (size_t i = 0; i < n; ++i) {
        const Node& nd = g_.nodes[i];
        const bool alias = nd.op == Op::Reshape || nd.op == Op::View || nd.op == Op::KvCacheWrite || inplace_[i];
        root[i] = alias ? root[static_cast<size_t>(nd.op == Op::EmbeddingBackward ? nd.inputs[2] : nd.inputs[0])] : i;
      }
      std::fill(last.begin(), last.end(), 0);
      for (size_t i = 0; i < n; ++i) {
        last[root[i]] = std::max(last[root[i]], i);
        for (graph::ValueId in : g_.nodes[i].inputs)
          if (in != kNone) last[root[static_cast<size_t>(in)]] = std::max(last[root[static_cast<size_t>(in)]], i);
      }
      for (graph::ValueId o : g_.outputs) last[root[static_cast<size_t>(o)]] = n;
    };
    liveness();
    // In-place update: the scatter-add of a tied embedding's gradient adds into its base (the head's gradient)
    // when nothing reads the base afterwards, instead of copying [V, C] floats first.
    bool any_inplace = false;
    for (size_t i = 0; i < n; ++i) {
      const Node& nd = g_.nodes[i];
      if (nd.op != Op::EmbeddingBackward || nd.inputs.size() < 3 || nd.inputs[2] == kNone) continue;
      const size_t base = static_cast<size_t>(nd.inputs[2]);
      if (g_.nodes[base].dtype == nd.dtype && g_.nodes[root[base]].op != Op::Input && last[root[base]] == i) inplace_[i] = any_inplace = true;
    }
    if (any_inplace) liveness();
    struct Block {
      size_t offset, size;
    };
    std::vector<Block> free_blocks;
    std::vector<std::pair<size_t, Block>> live;  // (last use, block)
    offsets_.assign(n, SIZE_MAX);
    size_t top = 0;
    for (size_t i = 0; i < n; ++i) {
      // Release buffers whose last reader ran before this node.
      for (size_t k = 0; k < live.size();) {
        if (live[k].first < i) {
          free_blocks.push_back(live[k].second);
          live[k] = live.back();
          live.pop_back();
        } else {
          ++k;
        }
      }
      const Node& nd = g_.nodes[i];
      if (nd.op == Op::Input || root[i] != i) continue;
      const size_t bytes = (static_cast<size_t>(shape_numel(nd.shape)) * dtype_size(nd.dtype) + 63) / 64 * 64 + 64;
      size_t best = SIZE_MAX;
      for (size_t k = 0; k < free_blocks.size(); ++k)
        if (free_blocks[k].size >= bytes && (best == SIZE_MAX || free_blocks[k].size < free_blocks[best].size)) best = k;
      Block b;
      if (best != SIZE_MAX) {
        b = free_blocks[best];
        free_blocks.erase(free_blocks.begin() + static_cast<std::ptrdiff_t>(best));
        if (b.size > bytes + 4096) free_blocks.push_back({b.offset + bytes, b.size - bytes}), b.size = bytes;
      } else {
        b = {top, bytes};
        top += bytes;
      }
      offsets_[i] = b.offset;
      live.emplace_back(last[i], b);
    }
    arena_bytes_ = top;
  }

  // The plan as text: a header line, then "offset inplace" per node (offset - for none).
  static constexpr const char* kPlanMagic = "trl-cpu-plan 1";
  std::string plan_blob() const override {
    std::string out = fmt::format("{} {} {}\n", kPlanMagic, g_.nodes.size(), arena_bytes_);
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      out += offsets_[i] == SIZE_MAX ? fmt::format("- {}\n", inplace_[i] ? 1 : 0) : fmt::format("{} {}\n", offsets_[i], inplace_[i] ? 1 : 0);
    return out;
  }
  // Adopts a plan_blob() after checking that it fits this graph: node count, every buffer inside the arena, buffers
  // exactly for the nodes that need one, in-place only where allowed. Anything else: false (plan anew).
  bool load_plan(const std::string& blob) {
    std::istringstream in(blob);
    std::string magic1, magic2;
    size_t n = 0, arena = 0;
    if (!(in >> magic1 >> magic2 >> n >> arena) || magic1 + " " + magic2 != kPlanMagic || n != g_.nodes.size()) return false;
    std::vector<size_t> offsets(n, SIZE_MAX);
    std::vector<bool> inplace(n, false);
    for (size_t i = 0; i < n; ++i) {
      std::string off;
      int ip = 0;
      if (!(in >> off >> ip) || (ip != 0 && ip != 1)) return false;
      const Node& nd = g_.nodes[i];
      const bool alias = nd.op == Op::Input || nd.op == Op::Reshape || nd.op == Op::View || nd.op == Op::KvCacheWrite || ip == 1;
      if (ip == 1 && (nd.op != Op::EmbeddingBackward || nd.inputs.size() < 3 || nd.inputs[2] == kNone)) return false;
      if (off == "-") {
        if (!alias) return false;
      } else {
        if (alias) return false;
        char* end = nullptr;
        const unsigned long long v = std::strtoull(off.c_str(), &end, 10);
        if (end == off.c_str() || *end != '\0' || v + data_bytes(i) + 64 > arena) return false;
        offsets[i] = static_cast<size_t>(v);
      }
      inplace[i] = ip == 1;
    }
    offsets_ = std::move(offsets);
    inplace_ = std::move(inplace);
    arena_bytes_ = arena;
    return true;
  }

  void bind_arena() {
    char* base = static_cast<char*>(arena_->buffer.mutable_data());
    for (size_t i = 0; i < ptr_.size(); ++i)
      if (offsets_[i] != SIZE_MAX) ptr_[i] = base + offsets_[i];
    bound_version_ = arena_->version;
  }

  void allocate() {
    ptr_.assign(g_.nodes.size(), nullptr);
    arena_->reserve(arena_bytes_);
    bind_arena();
    const char* env = std::getenv("TRL_CHECK_GUARDS");
    check_guards_ = env != nullptr && std::string(env) == "1";
    const char* prof = std::getenv("TRL_PROFILE");
    profile_ = prof != nullptr && std::string(prof) == "1";
  }

 public:
  ~CpuProgram() override {
    if (!profile_) return;
    std::fprintf(stderr, "[trl profile] seconds per op kind over all runs of this program:\n");
    for (size_t k = 0; k < op_seconds_.size(); ++k)
      if (op_seconds_[k] > 0) std::fprintf(stderr, "  %-24s %8.3f\n", graph::op_name(static_cast<Op>(k)), op_seconds_[k]);
  }

 private:
  // Every buffer is followed by at least 64 bytes of padding. With TRL_CHECK_GUARDS=1 the padding is filled with
  // a pattern before each node runs and checked after it, so a kernel writing past its output is caught by name.
  size_t data_bytes(size_t i) const { return static_cast<size_t>(shape_numel(g_.nodes[i].shape)) * dtype_size(g_.nodes[i].dtype); }
  void fill_guard(size_t i) {
    if (offsets_[i] != SIZE_MAX) std::memset(static_cast<char*>(ptr_[i]) + data_bytes(i), 0xAB, 64);
  }
  void verify_guard(size_t i) const {
    if (offsets_[i] == SIZE_MAX) return;
    const unsigned char* g = static_cast<const unsigned char*>(ptr_[i]) + data_bytes(i);
    for (int k = 0; k < 64; ++k)
      if (g[k] != 0xAB) fail("cpu backend: node %{} ({} '{}') wrote past the end of its output", i, graph::op_name(g_.nodes[i].op), g_.nodes[i].name);
  }

  void* p(graph::ValueId v) { return ptr_[static_cast<size_t>(v)]; }
  char* scratch(size_t offset) { return static_cast<char*>(arena_->buffer.mutable_data()) + arena_bytes_ + offset; }
  const Node& nd(graph::ValueId v) const { return g_.node(v); }

  // ---- lowering: one closure per node, with shapes and primitives fixed now ----
  std::function<void()> lower(graph::ValueId id) {
    const Node& n = g_.node(id);
    auto in = [&](size_t k) { return n.inputs[k]; };
    const DType od = n.dtype;
    switch (n.op) {
      case Op::Input:
      case Op::Reshape:
      case Op::View:
        return nullptr;
      case Op::Cast: {
        const DType sd = nd(in(0)).dtype;
        const int64_t count = shape_numel(n.shape);
        const graph::ValueId x = in(0);
        return [this, id, x, sd, od, count] {
          const void* s = p(x);
          void* d = p(id);
          if (sd == DType::F32 && od == DType::BF16) {
            const float* a = static_cast<const float*>(s);
            uint16_t* b = static_cast<uint16_t*>(d);
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < count; ++i) b[i] = f32_to_bf16(a[i]);
            return;
          }
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < count; ++i) st(d, od, i, ld(s, sd, i));
        };
      }
      case Op::Fill: {
        const int64_t count = shape_numel(n.shape);
        const float v = static_cast<float>(n.attrs.value);
        return [this, id, od, count, v] {
          for (int64_t i = 0; i < count; ++i) st(p(id), od, i, v);
        };
      }
      case Op::Embedding: {
        const graph::ValueId ids = in(0), table = in(1);
        const int64_t C = nd(table).shape[1], V = nd(table).shape[0], rows = shape_numel(nd(ids).shape);
        const DType td = nd(table).dtype;
        return [this, id, ids, table, C, V, rows, td, od] {
          const int32_t* x = static_cast<const int32_t*>(p(ids));
          for (int64_t r = 0; r < rows; ++r)
            if (x[r] < 0 || x[r] >= V) fail("embedding: token id {} at flat position {} is out of range for a vocabulary of {}", x[r], r, V);
          dispatch(td, p(table), od, p(id), [&](auto tab, auto out) {
#pragma omp parallel for schedule(static)
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c = 0; c < C; ++c) out.st(r * C + c, tab.ld(x[r] * C + c));
          });
        };
      }
      case Op::MatMul: {  // y[M,N] = x[M,K]·w[N,K]ᵀ + b
        const graph::ValueId x = in(0), w = in(1), b = in(2);
        const int64_t K = nd(x).shape.back(), M = shape_numel(nd(x).shape) / K, N = nd(w).shape[0];
        return gemm_node(id, x, w, b, M, N, K, /*a row-major*/ K, 1, /*b = wᵀ*/ 1, K);
      }
      case Op::MatMulNN: {  // y[M,K] = dy[M,N]·w[N,K]
        const graph::ValueId a = in(0), w = in(1);
        const int64_t N = nd(w).shape[0], K = nd(w).shape[1], M = shape_numel(nd(a).shape) / N;
        return gemm_node(id, a, w, kNone, M, K, N, N, 1, K, 1);
      }
      case Op::MatMulTN: {  // y[N,K] = a[R,N]ᵀ·b[R,K]
        const graph::ValueId a = in(0), b = in(1);
        const int64_t N = nd(a).shape.back(), K = nd(b).shape.back(), R = shape_numel(nd(a).shape) / N;
        return gemm_node(id, a, b, kNone, N, K, R, 1, N, K, 1);
      }
      case Op::RmsNorm: return lower_rms_norm(n, id);
      case Op::Rope: return lower_rope(n, id);
      case Op::Attention:
        if (n.inputs.size() > 4 && n.inputs[4] != kNone) return lower_attention_at_positions(n, id);
        return lower_attention(n, id, false);
      case Op::Slice: {
        const graph::ValueId x = in(0);
        const int64_t B = nd(x).shape[0], T = nd(x).shape[1], inner = shape_numel(nd(x).shape) / (B * T);
        const int64_t es = static_cast<int64_t>(dtype_size(od)), start = n.attrs.offset, rows = n.attrs.rows;
        return [this, id, x, B, T, inner, es, start, rows] {
          for (int64_t b = 0; b < B; ++b)
            std::memcpy(static_cast<char*>(p(id)) + b * rows * inner * es, static_cast<const char*>(p(x)) + (b * T + start) * inner * es,
                        static_cast<size_t>(rows * inner * es));
        };
      }
      case Op::KvCacheWrite: {
        const graph::ValueId x = in(1), pos = in(2);
        const int64_t B = n.shape[0], S = n.shape[1], row = n.shape[2] * n.shape[3], T = nd(x).shape[1];
        const DType dx = nd(x).dtype;
        const std::string name = n.name;
        return [this, id, x, pos, B, S, row, T, dx, od, name] {
          const int64_t p0 = static_cast<const int32_t*>(p(pos))[0];
          if (p0 < 0 || p0 + T > S) fail("kv_cache_write {}: rows [{}, {}) do not fit a cache of {} positions", name, p0, p0 + T, S);
          for (int64_t b = 0; b < B; ++b) {
            if (dx == od) {
              const size_t es = dtype_size(od);
              std::memcpy(static_cast<char*>(p(id)) + static_cast<size_t>((b * S + p0) * row) * es,
                          static_cast<const char*>(p(x)) + static_cast<size_t>(b * T * row) * es, static_cast<size_t>(T * row) * es);
            } else {
              for (int64_t i = 0; i < T * row; ++i) st(p(id), od, (b * S + p0) * row + i, ld(p(x), dx, b * T * row + i));
            }
          }
        };
      }
      case Op::AttentionBackward: return lower_attention(n, id, true);
      case Op::SwiGLU: {
        const graph::ValueId a = in(0), b = in(1);
        const DType da = nd(a).dtype, db = nd(b).dtype;
        const int64_t count = shape_numel(n.shape);
        return [this, id, a, b, da, db, od, count] {
          dispatch(da, p(a), db, p(b), od, p(id), [&](auto ga, auto ub, auto out) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < count; ++i) {
              const float g = ga.ld(i);
              out.st(i, ga.round(g / (1.0f + std::exp(-g))) * ub.ld(i));
            }
          });
        };
      }
      case Op::SwiGLUBackward: {
        const graph::ValueId a = in(0), b = in(1), dy = in(2);
        const DType da = nd(a).dtype, db = nd(b).dtype, dd = nd(dy).dtype;
        const int64_t count = shape_numel(nd(a).shape);
        return [this, id, a, b, dy, da, db, dd, od, count] {
          const DType pair = da == db ? da : DType::F64;  // gate and up share a dtype in practice (else: any-dtype loads)
          dispatch(pair, p(a), dd, p(dy), od, p(id), [&](auto ga, auto dya, auto out) {
            auto ub = ga;
            ub.p = static_cast<decltype(ga.p)>(p(b));
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < count; ++i) {
              const float g = ga.ld(i), u = ub.ld(i), d = dya.ld(i);
              const float sig = 1.0f / (1.0f + std::exp(-g));
              out.st(i, d * u * sig * (1.0f + g * (1.0f - sig)));
              out.st(count + i, d * g * sig);
            }
          });
        };
      }
      case Op::Add: {
        const graph::ValueId a = in(0), b = in(1);
        const DType da = nd(a).dtype, db = nd(b).dtype;
        const int64_t count = shape_numel(n.shape);
        return [this, id, a, b, da, db, od, count] {
          if (da == DType::F32 && db == DType::F32 && od == DType::F32) {
            const float* x = static_cast<const float*>(p(a));
            const float* y = static_cast<const float*>(p(b));
            float* z = static_cast<float*>(p(id));
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < count; ++i) z[i] = x[i] + y[i];
            return;
          }
          dispatch(da, p(a), db, p(b), od, p(id), [&](auto x, auto y, auto z) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < count; ++i) z.st(i, x.ld(i) + y.ld(i));
          });
        };
      }
      case Op::ScaleBy: {
        const graph::ValueId a = in(0), s = in(1);
        const DType da = nd(a).dtype, ds = nd(s).dtype;
        const int64_t count = shape_numel(n.shape);
        return [this, id, a, s, da, ds, od, count] {
          const float sc = ld(p(s), ds, 0);
          dispatch(da, p(a), od, p(id), [&](auto x, auto z) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < count; ++i) z.st(i, sc * x.ld(i));
          });
        };
      }
      case Op::WeightedSum: {
        const graph::ValueId a = in(0), w = in(1);
        const DType da = nd(a).dtype, dw = nd(w).dtype;
        const int64_t count = shape_numel(nd(a).shape);
        return [this, id, a, w, da, dw, od, count] {
          double acc = 0;
          for (int64_t i = 0; i < count; ++i) acc += static_cast<double>(ld(p(a), da, i)) * ld(p(w), dw, i);
          st(p(id), od, 0, static_cast<float>(acc));
        };
      }
      case Op::SumRows: {
        const graph::ValueId a = in(0);
        const DType da = nd(a).dtype;
        const int64_t N = nd(a).shape.back(), R = shape_numel(nd(a).shape) / N;
        return [this, id, a, da, od, N, R] {
#pragma omp parallel for schedule(static)
          for (int64_t c = 0; c < N; ++c) {
            float acc = 0;
            for (int64_t r = 0; r < R; ++r) acc += ld(p(a), da, r * N + c);
            st(p(id), od, c, acc);
          }
        };
      }
      case Op::EmbeddingBackward: {
        const graph::ValueId ids = in(0), dy = in(1), base = n.inputs.size() > 2 ? in(2) : kNone;
        const int64_t C = nd(dy).shape.back(), rows = shape_numel(nd(ids).shape), V = n.attrs.rows;
        const DType dd = nd(dy).dtype, db = base != kNone ? nd(base).dtype : od;
        return [this, id, ids, dy, base, C, rows, V, dd, db, od] {
          const int64_t total = V * C;
          if (inplace_[static_cast<size_t>(id)]) {
            // the output is the base's buffer: nothing to copy
          } else if (base == kNone) {
            std::memset(p(id), 0, static_cast<size_t>(total) * dtype_size(od));
          } else if (db == od) {
            const char* src = static_cast<const char*>(p(base));
            char* dst = static_cast<char*>(p(id));
            const int64_t bytes = total * static_cast<int64_t>(dtype_size(od));
#pragma omp parallel for schedule(static)
            for (int64_t chunk = 0; chunk < bytes; chunk += 1 << 20) {
              std::memcpy(dst + chunk, src + chunk, static_cast<size_t>(std::min<int64_t>(1 << 20, bytes - chunk)));
            }
          } else {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < total; ++i) st(p(id), od, i, ld(p(base), db, i));
          }
          // Rows in order, columns contiguous: a token seen twice adds twice; a few hundred rows, no threads needed.
          const int32_t* x = static_cast<const int32_t*>(p(ids));
          for (int64_t r = 0; r < rows; ++r) {
            if (od == DType::F32 && dd == DType::F32) {
              float* o = static_cast<float*>(p(id)) + static_cast<int64_t>(x[r]) * C;
              const float* g = static_cast<const float*>(p(dy)) + r * C;
              for (int64_t c = 0; c < C; ++c) o[c] += g[c];
            } else {
              for (int64_t c = 0; c < C; ++c) st(p(id), od, x[r] * C + c, ld(p(id), od, x[r] * C + c) + ld(p(dy), dd, r * C + c));
            }
          }
        };
      }
      case Op::RmsNormBackX:
      case Op::RmsNormBackW: return lower_rms_norm_backward(n, id);
      case Op::TokenLogprobs:
      case Op::TokenLogprobsBackward:
      case Op::Entropy:
      case Op::EntropyBackward:
      case Op::TokenArgmaxMatch: return lower_token_logprobs(n, id);
    }
    fail("cpu backend: op {} is not implemented", graph::op_name(n.op));
  }

  // GEMM with operands of mixed dtypes: oneDNN takes (bf16|f32)x(bf16|f32) when both match; otherwise the
  // lower-precision operand is widened to f32 into a scratch buffer first.
  static constexpr int64_t kGemvRows = 8;
  // y[m, n] = x[m, :]·w[n, :] (+ bias[n]) for M <= kGemvRows: one pass over w, split by rows of w across threads.
  std::function<void()> gemv_node(graph::ValueId id, graph::ValueId a, graph::ValueId b, graph::ValueId bias, int64_t M, int64_t N, int64_t K) {
    const DType ta = nd(a).dtype, tb = nd(b).dtype, tc = g_.node(id).dtype, tbias = bias != kNone ? nd(bias).dtype : DType::F32;
    auto xf = std::make_shared<std::vector<float>>(static_cast<size_t>(M * K));
#if defined(__x86_64__)
    const bool bf16dot = ta == DType::BF16 && tb == DType::BF16 && cpu_features().avx512bf16 && !std::getenv("TRL_NO_AVX512BF16");
#else
    const bool bf16dot = false;
#endif
    return [this, id, a, b, bias, M, N, K, ta, tb, tc, tbias, xf, bf16dot] {
      if (!bf16dot)
        for (int64_t i = 0; i < M * K; ++i) (*xf)[static_cast<size_t>(i)] = ld(p(a), ta, i);
      const float* x = xf->data();
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
          const float bv = bias != kNone ? ld(p(bias), tbias, n) : 0.0f;
          float dots[kGemvRows];
#if defined(__x86_64__)
          if (bf16dot) {
            kernels::dots_bf16bf16(static_cast<const uint16_t*>(p(a)), M, K, static_cast<const uint16_t*>(p(b)) + n * K, dots);
          } else
#endif
          if (tb == DType::BF16 && M == 1) {
            dots[0] = kernels::dot_bf16(x, static_cast<const uint16_t*>(p(b)) + n * K, K);
          } else if (tb == DType::BF16) {
            kernels::dots_bf16(x, M, K, static_cast<const uint16_t*>(p(b)) + n * K, dots);
          } else {
            for (int64_t m = 0; m < M; ++m) dots[m] = kernels::dot(x + m * K, static_cast<const float*>(p(b)) + n * K, K);
          }
          for (int64_t m = 0; m < M; ++m) st(p(id), tc, m * N + n, dots[m] + bv);
        }
    };
  }

  std::function<void()> gemm_node(graph::ValueId id, graph::ValueId a, graph::ValueId b, graph::ValueId bias, int64_t M, int64_t N, int64_t K,
                                  int64_t sa_m, int64_t sa_k, int64_t sb_k, int64_t sb_n) {
    DType ta = nd(a).dtype, tb = nd(b).dtype;
    const DType tc = g_.node(id).dtype;
    // A few rows against a weight in nn.Linear layout (decoding) is memory-bound: read each weight row once for
    // all rows (dots_bf16 widens it in registers).
    if (M <= kGemvRows && sa_m == K && sa_k == 1 && sb_k == 1 && sb_n == K && (tb == DType::BF16 || tb == DType::F32))
      return gemv_node(id, a, b, bias, M, N, K);
    const bool widen_a = ta != tb && ta != DType::F32, widen_b = ta != tb && tb != DType::F32;
    if (widen_a) ta = DType::F32;
    if (widen_b) tb = DType::F32;
    auto gemm = std::make_shared<Gemm>(M, N, K, ta, sa_m, sa_k, tb, sb_k, sb_n, tc, bias != kNone, false);
    auto scratch_a = std::make_shared<std::vector<float>>(widen_a ? static_cast<size_t>(shape_numel(nd(a).shape)) : 0);
    auto scratch_b = std::make_shared<std::vector<float>>(widen_b ? static_cast<size_t>(shape_numel(nd(b).shape)) : 0);
    auto bias_f32 = std::make_shared<std::vector<float>>(bias != kNone ? static_cast<size_t>(N) : 0);
    const DType oa = nd(a).dtype, ob = nd(b).dtype, obias = bias != kNone ? nd(bias).dtype : DType::F32;
    return [this, id, a, b, bias, gemm, scratch_a, scratch_b, bias_f32, oa, ob, obias] {
      const void* pa = p(a);
      const void* pb = p(b);
      if (!scratch_a->empty()) {
        for (size_t i = 0; i < scratch_a->size(); ++i) (*scratch_a)[i] = ld(pa, oa, static_cast<int64_t>(i));
        pa = scratch_a->data();
      }
      if (!scratch_b->empty()) {
        for (size_t i = 0; i < scratch_b->size(); ++i) (*scratch_b)[i] = ld(pb, ob, static_cast<int64_t>(i));
        pb = scratch_b->data();
      }
      const void* pbias = nullptr;
      if (bias != kNone) {
        for (size_t i = 0; i < bias_f32->size(); ++i) (*bias_f32)[i] = ld(p(bias), obias, static_cast<int64_t>(i));
        pbias = bias_f32->data();
      }
      gemm->run(pa, pb, p(id), pbias);
    };
  }

  std::function<void()> lower_rms_norm(const Node& n, graph::ValueId id) {
    const graph::ValueId x = n.inputs[0], w = n.inputs[1];
    const int64_t C = n.shape.back(), R = shape_numel(n.shape) / C;
    const DType dx = nd(x).dtype, dw = nd(w).dtype, od = n.dtype;
    const float eps = static_cast<float>(n.attrs.eps);
    auto wf = std::make_shared<std::vector<float>>(static_cast<size_t>(C));
    return [this, id, x, w, C, R, dx, dw, od, eps, wf] {
      for (int64_t c = 0; c < C; ++c) (*wf)[static_cast<size_t>(c)] = ld(p(w), dw, c);
      const float* wv = wf->data();
      dispatch(dx, p(x), od, p(id), [&](auto xa, auto out) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < R; ++r) {
          const double ss = sum_squares(xa, r * C, C);
          const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
          for (int64_t c = 0; c < C; ++c) out.st(r * C + c, xa.round(xa.ld(r * C + c) * inv) * wv[c]);
        }
      });
    };
  }

  std::function<void()> lower_rms_norm_backward(const Node& n, graph::ValueId id) {
    const bool want_x = n.op == Op::RmsNormBackX;
    const graph::ValueId x = n.inputs[0], w = want_x ? n.inputs[1] : kNone, dy = want_x ? n.inputs[2] : n.inputs[1];
    const int64_t C = nd(x).shape.back(), R = shape_numel(nd(x).shape) / C;
    const DType dx = nd(x).dtype, dw = w != kNone ? nd(w).dtype : DType::F32, dd = nd(dy).dtype, od = n.dtype;
    const double eps = n.attrs.eps;
    auto acc = std::make_shared<std::vector<double>>();
    auto wf = std::make_shared<std::vector<float>>(static_cast<size_t>(C));
    return [this, id, x, w, dy, C, R, dx, dw, dd, od, eps, want_x, acc, wf] {
      if (want_x) {
        for (int64_t c = 0; c < C; ++c) (*wf)[static_cast<size_t>(c)] = ld(p(w), dw, c);
        const float* wv = wf->data();
        dispatch(dx, p(x), dd, p(dy), od, p(id), [&](auto xa, auto ga, auto out) {
#pragma omp parallel for schedule(static)
          for (int64_t r = 0; r < R; ++r) {
            double ss[8] = {}, dot[8] = {};
            int64_t c = 0;
            for (; c + 8 <= C; c += 8)
              for (int k = 0; k < 8; ++k) {
                const double xv = xa.ld(r * C + c + k);
                ss[k] += xv * xv;
                dot[k] += static_cast<double>(wv[c + k]) * ga.ld(r * C + c + k) * xv;
              }
            for (int k = 1; k < 8; ++k) ss[0] += ss[k], dot[0] += dot[k];
            for (; c < C; ++c) {
              const double xv = xa.ld(r * C + c);
              ss[0] += xv * xv;
              dot[0] += static_cast<double>(wv[c]) * ga.ld(r * C + c) * xv;
            }
            const double inv = 1.0 / std::sqrt(ss[0] / static_cast<double>(C) + eps);
            const float fi = static_cast<float>(inv), fk = static_cast<float>(inv * inv * inv / static_cast<double>(C) * dot[0]);
            for (c = 0; c < C; ++c) out.st(r * C + c, fi * wv[c] * ga.ld(r * C + c) - fk * xa.ld(r * C + c));
          }
        });
        return;
      }
      const int threads = omp_get_max_threads();
      acc->assign(static_cast<size_t>(C * threads), 0.0);
#pragma omp parallel
      {
        double* mine = acc->data() + static_cast<int64_t>(omp_get_thread_num()) * C;
        dispatch(dx, p(x), dd, p(dy), [&](auto xa, auto ga) {
#pragma omp for schedule(static)
          for (int64_t r = 0; r < R; ++r) {
            const double inv = 1.0 / std::sqrt(sum_squares(xa, r * C, C) / static_cast<double>(C) + eps);
            for (int64_t c = 0; c < C; ++c) mine[c] += static_cast<double>(ga.ld(r * C + c)) * xa.ld(r * C + c) * inv;
          }
        });
      }
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int t = 0; t < threads; ++t) s += (*acc)[static_cast<size_t>(t * C + c)];
        st(p(id), od, c, static_cast<float>(s));
      }
    };
  }

  std::function<void()> lower_rope(const Node& n, graph::ValueId id) {
    const graph::ValueId x = n.inputs[0], pos = n.inputs[1];
    const int64_t B = n.shape[0], T = n.shape[1], H = n.shape[2], D = n.shape[3], half = D / 2;
    const DType dx = nd(x).dtype, od = n.dtype;
    const auto a = n.attrs;
    return [this, id, x, pos, B, T, H, D, half, dx, od, a] {
      const int32_t* ps = static_cast<const int32_t*>(p(pos));
#pragma omp parallel for schedule(static)
      for (int64_t bt = 0; bt < B * T; ++bt) {
        const float pf = static_cast<float>(ps[bt]);
        float cs[512], sn[512];
        for (int64_t j = 0; j < half; ++j) {
          const float angle = pf * a.inv_freq[static_cast<size_t>(j)];
          cs[j] = rnd(dx, static_cast<float>(std::cos(static_cast<double>(angle)) * a.rope_scaling));
          sn[j] = rnd(dx, static_cast<float>(std::sin(static_cast<double>(angle)) * a.rope_scaling)) * (a.inverse ? -1.0f : 1.0f);
        }
        dispatch(dx, p(x), od, p(id), [&](auto xa, auto out) {
          for (int64_t h = 0; h < H; ++h) {
            const int64_t base = (bt * H + h) * D;
            for (int64_t j = 0; j < half; ++j) {
              const float x1 = xa.ld(base + j), x2 = xa.ld(base + j + half);
              out.st(base + j, xa.round(x1 * cs[j]) + xa.round(-x2 * sn[j]));
              out.st(base + j + half, xa.round(x2 * cs[j]) + xa.round(x1 * sn[j]));
            }
          }
        });
      }
    };
  }

  // Flash-style attention forward and backward with GEMMs. One task per (batch, kv head); the queries of each head
  // are taken in blocks of kQueryBlock rows, and a block multiplies only the keys it may see: with a causal mask
  // query t sees keys up to t + S - T, so the upper triangle is skipped (about half the work at T = S). The GEMMs
  // read Q, K, V and dO in place from their [B, T, H, D] layout (strided operands, in the model's dtype: bf16 or
  // f32, accumulated in f32) and write O and dQ in place; scores and softmax statistics are f32. A block's scores
  // [rows, keys] are the only temporary — the [T, S] square is never held. Forward rounding follows eager
  // Transformers for a bf16 model (scores and probabilities stored in bf16); the backward pass recomputes the same
  // probabilities, forms dS = P∘(dP - Σ P∘dP)·scale in f32 and feeds the GEMMs of dQ, dK, dV in the compute dtype,
  // as autocast's bf16 matmul backward does. dK, dV of the query heads that share a kv head accumulate in f32.
  static constexpr int64_t kQueryBlock = 64;
  std::function<void()> lower_attention(const Node& n, graph::ValueId id, bool backward) {
    const graph::ValueId q = n.inputs[0], k = n.inputs[1], v = n.inputs[2], mask = n.inputs[3], dy = backward ? n.inputs[4] : kNone;
    const Shape& qs = nd(q).shape;
    const Shape& ks = nd(k).shape;
    const int64_t B = qs[0], T = qs[1], H = qs[2], D = qs[3], S = ks[1], Hkv = ks[2];
    const DType dq = nd(q).dtype, dk = nd(k).dtype, dv = nd(v).dtype, dd = backward ? nd(dy).dtype : dq, od = n.dtype;
    // The GEMMs' dtype: the inputs' own when they agree (bf16 or f32), else f32 (operands converted per task).
    const bool same = dq == dk && dk == dv && dd == dq && (dq == DType::F32 || dq == DType::BF16);
    const DType ct = same ? dq : DType::F32;
    const DType ot = od == DType::F32 || od == DType::BF16 ? od : DType::F32;  // O / dQ written directly when possible
    const bool direct_out = ot == od;
    const float scale = static_cast<float>(n.attrs.scale);
    const bool causal = n.attrs.causal;
    const int64_t nq = B * T * H * D, nk = B * S * Hkv * D, offset = S - T;
    // Row strides of Q/dO, K/V and O/dQ as the GEMMs see them (in place, or per-task contiguous copies).
    const int64_t ldq = same ? H * D : D, ldk = same ? Hkv * D : D, ldo = direct_out ? H * D : D;
    struct Block {
      int64_t t0, rows, keys;
      std::shared_ptr<Gemm> qk, pv, dp, dq, dk, dv;
    };
    auto blocks = std::make_shared<std::vector<Block>>();
    const DType f = DType::F32;
    for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
      Block bl;
      bl.t0 = t0;
      bl.rows = std::min(kQueryBlock, T - t0);
      bl.keys = causal ? std::clamp<int64_t>(t0 + bl.rows + offset, 0, S) : S;
      const int64_t R = bl.rows, L = bl.keys;
      if (L > 0) {
        bl.qk = std::make_shared<Gemm>(R, L, D, ct, ldq, 1, ct, 1, ldk, f, false, false);  // S = Q·Kᵀ      [R, L] f32
        if (!backward) {
          bl.pv = std::make_shared<Gemm>(R, D, L, ct, L, 1, ct, ldk, 1, ot, false, false, ldo);  // O = P·V  [R, D]
        } else {
          bl.dp = std::make_shared<Gemm>(R, L, D, ct, ldq, 1, ct, 1, ldk, f, false, false);            // dP = dO·Vᵀ
          bl.dq = std::make_shared<Gemm>(R, D, L, ct, L, 1, ct, ldk, 1, ot, false, false, ldo);        // dQ = dS·K
          bl.dk = std::make_shared<Gemm>(L, D, R, ct, 1, L, ct, ldq, 1, f, false, true);               // dK += dSᵀ·Q
          bl.dv = std::make_shared<Gemm>(L, D, R, ct, 1, L, ct, ldq, 1, f, false, true);               // dV += Pᵀ·dO
        }
      }
      blocks->push_back(std::move(bl));
    }
    const size_t es = dtype_size(ct);
    return [this, id, q, k, v, mask, dy, B, T, H, D, S, Hkv, dq, dk, dv, dd, od, ct, same, direct_out, scale, causal, backward, nq, nk,
            offset, ldq, ldk, ldo, blocks, es] {
      const int64_t rep = H / Hkv;
      const int32_t* m = mask != kNone ? static_cast<const int32_t*>(p(mask)) : nullptr;
      char* out = static_cast<char*>(p(id));
#pragma omp parallel for schedule(dynamic)
      for (int64_t bh = 0; bh < B * Hkv; ++bh) {
        const int64_t b = bh / Hkv, hk = bh % Hkv;
        thread_local std::vector<float> Sc, dP, dK, dV, Ot;
        thread_local std::vector<char> P16, dS16, Kc, Vc, Qc, Gc;
        Sc.resize(static_cast<size_t>(kQueryBlock * S));
        P16.resize(static_cast<size_t>(kQueryBlock * S) * es);
        // Operands: in place when their dtype is the compute dtype, else converted to contiguous f32 per task.
        auto gather = [&](std::vector<char>& buf, graph::ValueId x, DType xd, int64_t rows, int64_t heads, int64_t head) -> const char* {
          buf.resize(static_cast<size_t>(rows * D) * sizeof(float));
          float* o = reinterpret_cast<float*>(buf.data());
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t d = 0; d < D; ++d) o[r * D + d] = ld(p(x), xd, ((b * rows + r) * heads + head) * D + d);
          return buf.data();
        };
        const char* K = same ? static_cast<const char*>(p(k)) + static_cast<size_t>(((b * S) * Hkv + hk) * D) * es : gather(Kc, k, dk, S, Hkv, hk);
        const char* V = same ? static_cast<const char*>(p(v)) + static_cast<size_t>(((b * S) * Hkv + hk) * D) * es : gather(Vc, v, dv, S, Hkv, hk);
        if (backward) {
          dP.resize(static_cast<size_t>(kQueryBlock * S));
          dS16.resize(static_cast<size_t>(kQueryBlock * S) * es);
          dK.assign(static_cast<size_t>(S * D), 0.0f);
          dV.assign(static_cast<size_t>(S * D), 0.0f);
        }
        if (!direct_out) Ot.resize(static_cast<size_t>(T * D));
        for (int64_t h = hk * rep; h < (hk + 1) * rep; ++h) {
          const char* Q = same ? static_cast<const char*>(p(q)) + static_cast<size_t>(((b * T) * H + h) * D) * es : gather(Qc, q, dq, T, H, h);
          const char* G = !backward ? nullptr
                          : same    ? static_cast<const char*>(p(dy)) + static_cast<size_t>(((b * T) * H + h) * D) * es
                                    : gather(Gc, dy, dd, T, H, h);
          char* O = direct_out ? out + static_cast<size_t>(((b * T) * H + h) * D) * dtype_size(od) : reinterpret_cast<char*>(Ot.data());
          for (const Block& bl : *blocks) {
            const int64_t R = bl.rows, L = bl.keys;
            char* Ob = O + static_cast<size_t>(bl.t0 * ldo) * dtype_size(direct_out ? od : DType::F32);
            if (L == 0) {  // no visible key: the rows are zero
              for (int64_t r = 0; r < R; ++r) std::memset(Ob + static_cast<size_t>(r * ldo) * dtype_size(direct_out ? od : DType::F32), 0, static_cast<size_t>(D) * dtype_size(direct_out ? od : DType::F32));
              continue;
            }
            const char* Qb = Q + static_cast<size_t>(bl.t0 * ldq) * es;
            bl.qk->run(Qb, K, Sc.data());
            // Row-wise masked softmax of scale·scores → P (f32 in Sc, and in the compute dtype in P16).
            const bool b16 = ct == DType::BF16;
            for (int64_t r = 0; r < R; ++r) {
              const int64_t t = bl.t0 + r;
              float* row = Sc.data() + r * L;
              uint16_t* p16 = b16 ? reinterpret_cast<uint16_t*>(P16.data()) + r * L : nullptr;
              const int64_t limit = causal ? std::min(L, t + offset + 1) : L;
              const int32_t seg = m ? m[b * S + t + offset] : 1;  // segment ids: 0 = padding, else the packed sequence
              // A padding query sees nothing; otherwise the keys of its own segment (padding keys are segment 0).
              const float mx = m && seg == 0 ? -INFINITY : kernels::attention_scores(row, limit, scale, b16, m ? m + b * S : nullptr, seg);
              if (mx == -INFINITY) {
                std::fill(row, row + L, 0.0f);
                if (p16) std::fill(p16, p16 + L, uint16_t{0});
                continue;
              }
              const float inv = 1.0f / kernels::exp_shift_sum(row, limit, mx);
              kernels::scale_round(row, limit, inv, b16, p16);
              std::fill(row + limit, row + L, 0.0f);
              if (p16) std::fill(p16 + limit, p16 + L, uint16_t{0});
            }
            const char* Pc = ct == DType::BF16 ? P16.data() : reinterpret_cast<const char*>(Sc.data());
            if (!backward) {
              bl.pv->run(Pc, V, Ob);
              continue;
            }
            // dP = dO·Vᵀ; dS = P∘(dP - Σ_j P∘dP)·scale; dQ = dS·K; dK += dSᵀ·Q; dV += Pᵀ·dO.
            const char* Gb = G + static_cast<size_t>(bl.t0 * ldq) * es;
            bl.dp->run(Gb, V, dP.data());
            for (int64_t r = 0; r < R; ++r)
              kernels::softmax_backward_row(Sc.data() + r * L, dP.data() + r * L, L, scale,
                                            ct == DType::BF16 ? reinterpret_cast<uint16_t*>(dS16.data()) + r * L : nullptr);
            const char* dS = ct == DType::BF16 ? dS16.data() : reinterpret_cast<const char*>(dP.data());
            bl.dq->run(dS, K, Ob);
            bl.dk->run(dS, Qb, dK.data());
            bl.dv->run(Pc, Gb, dV.data());
          }
          if (!direct_out)
            for (int64_t t = 0; t < T; ++t)
              for (int64_t d = 0; d < D; ++d) st(out, od, ((b * T + t) * H + h) * D + d, Ot[static_cast<size_t>(t * D + d)]);
        }
        if (backward) {
          for (int64_t j = 0; j < S; ++j) {
            const int64_t kb = ((b * S + j) * Hkv + hk) * D;
            for (int64_t d = 0; d < D; ++d) {
              st(out, od, nq + kb + d, dK[static_cast<size_t>(j * D + d)]);
              st(out, od, nq + nk + kb + d, dV[static_cast<size_t>(j * D + d)]);
            }
          }
        }
      }
    };
  }

  // Attention of queries placed at given key positions (q_pos: a static KV cache's cache positions), for decoding:
  // a query at key index p sees keys 0..p (causal) of its own segment. One task per (batch, head); scores are dot
  // products against the cached keys in their dtype, the softmax is f32 with the forward rounding of a bf16 model,
  // and the output is the probability-weighted sum of the cached values. Keys after p are never read.
  std::function<void()> lower_attention_at_positions(const Node& n, graph::ValueId id) {
    const graph::ValueId q = n.inputs[0], k = n.inputs[1], v = n.inputs[2], mask = n.inputs[3], qpos = n.inputs[4];
    const Shape& qs = nd(q).shape;
    const Shape& ks = nd(k).shape;
    const int64_t B = qs[0], T = qs[1], H = qs[2], D = qs[3], S = ks[1], Hkv = ks[2];
    const DType dq = nd(q).dtype, dk = nd(k).dtype, dv = nd(v).dtype, od = n.dtype;
    const float scale = static_cast<float>(n.attrs.scale);
    const bool causal = n.attrs.causal;
    const std::string name = n.name;
    return [this, id, q, k, v, mask, qpos, B, T, H, D, S, Hkv, dq, dk, dv, od, scale, causal, name] {
      const int32_t* qp = static_cast<const int32_t*>(p(qpos));
      const int32_t* m = mask != kNone ? static_cast<const int32_t*>(p(mask)) : nullptr;
      for (int64_t i = 0; i < B * T; ++i)
        if (qp[i] < 0 || qp[i] >= S) fail("attention {}: query position {} (row {}, token {}) is outside the {} cached keys", name, qp[i], i / T, i % T, S);
      const int64_t rep = H / Hkv;
#pragma omp parallel for schedule(static)
      for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H, hk = h / rep;
        thread_local std::vector<float> sc, qv, kv, acc;
        sc.resize(static_cast<size_t>(S)), qv.resize(static_cast<size_t>(D)), kv.resize(static_cast<size_t>(D)), acc.resize(static_cast<size_t>(D));
        for (int64_t t = 0; t < T; ++t) {
          const int64_t pos = qp[b * T + t], qb = ((b * T + t) * H + h) * D;
          for (int64_t d = 0; d < D; ++d) qv[static_cast<size_t>(d)] = ld(p(q), dq, qb + d);
          const int64_t limit = causal ? pos + 1 : S;
          const int32_t seg = m ? m[b * S + pos] : 1;
          float mx = -INFINITY;
          for (int64_t j = 0; j < limit; ++j) {
            if (m && (m[b * S + j] == 0 || m[b * S + j] != seg)) {
              sc[static_cast<size_t>(j)] = -INFINITY;
              continue;
            }
            const int64_t kb = ((b * S + j) * Hkv + hk) * D;
            float dot;
            if (dk == DType::BF16) dot = kernels::dot_bf16(qv.data(), static_cast<const uint16_t*>(p(k)) + kb, D);
            else if (dk == DType::F32) dot = kernels::dot(qv.data(), static_cast<const float*>(p(k)) + kb, D);
            else {
              for (int64_t d = 0; d < D; ++d) kv[static_cast<size_t>(d)] = ld(p(k), dk, kb + d);
              dot = kernels::dot(qv.data(), kv.data(), D);
            }
            sc[static_cast<size_t>(j)] = rnd(dq, rnd(dq, dot) * scale);
            mx = std::max(mx, sc[static_cast<size_t>(j)]);
          }
          std::fill(acc.begin(), acc.end(), 0.0f);
          if (mx != -INFINITY) {
            kernels::exp_shift(sc.data(), limit, mx);
            const float inv = 1.0f / kernels::sum(sc.data(), limit);
            for (int64_t j = 0; j < limit; ++j) {
              const float pj = rnd(dq, sc[static_cast<size_t>(j)] * inv);
              if (pj == 0.0f) continue;
              const int64_t vb = ((b * S + j) * Hkv + hk) * D;
              if (dv == DType::BF16) kernels::axpy_bf16(acc.data(), pj, static_cast<const uint16_t*>(p(v)) + vb, D);
              else
                for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += pj * ld(p(v), dv, vb + d);
            }
          }
          for (int64_t d = 0; d < D; ++d) st(p(id), od, qb + d, acc[static_cast<size_t>(d)]);
        }
      }
    };
  }

  // token_logprobs, entropy and token_argmax_match over vocabulary chunks: logits [R, 4096] at a time through
  // oneDNN, never [R, V]. Pass 1 keeps per row a running max m (and where it first occurs), s = Σ e^(z-m) and
  // (entropy) t = Σ e^(z-m)·z, rescaled when m grows: lse = m + log s, H = lse - t/s. The forward nodes on the same
  // (h, w) (and targets) share that one pass: the first of them in program order computes what all of them need,
  // the others copy their values out (a trainer's entropy and accuracy metrics cost no second lm_head GEMM).
  // The backward node of the same (h, w[, targets]) reuses these statistics instead of recomputing the logits
  // once more, then forms dz per chunk:
  //   token_logprobs: dz = dlogp·(onehot(target) - p);   entropy: dz = -dH·p·(log p + H),
  // in the GEMM type (bf16 for a bf16 model, as autocast rounds the logits' gradient), and accumulates
  // dh += dz·w_chunk and dw_chunk = dzᵀ·h in f32.
  struct RowStats {
    std::vector<float> lse, ent, target;
    std::vector<int32_t> arg;
    int64_t saved = -1;  // scratch offset of the bf16 logits [chunks][R][c] kept for the backward node, or -1
  };
  struct PassGroup {
    graph::ValueId targets;
    std::shared_ptr<RowStats> stats;
  };
  std::function<void()> lower_token_logprobs(const Node& n, graph::ValueId id) {
    const bool entropy = n.op == Op::Entropy || n.op == Op::EntropyBackward;
    const bool backward = n.op == Op::TokenLogprobsBackward || n.op == Op::EntropyBackward;
    const graph::ValueId h = n.inputs[0], w = n.inputs[1], tg = entropy ? kNone : n.inputs[2];
    const graph::ValueId dl = backward ? n.inputs[entropy ? 2 : 3] : kNone;
    const int64_t C = nd(h).shape.back(), R = shape_numel(nd(h).shape) / C, V = nd(w).shape[0];
    const DType dh = nd(h).dtype, dw = nd(w).dtype, od = n.dtype, dd = backward ? nd(dl).dtype : DType::F32;
    const int64_t chunk = std::min(kVocabChunk, V);
    if (backward && od != DType::F32) fail("cpu backend: {} produces f32 gradients, not {}", graph::op_name(n.op), dtype_name(od));
    const char* what = graph::op_name(n.op);
    const Op op = n.op;
    auto check_targets = [what, R, V](const int32_t* t) {
      if (t)
        for (int64_t r = 0; r < R; ++r)
          if (t[r] < 0 || t[r] >= V) fail("{}: target {} at row {} is outside the vocabulary [0, {})", what, t[r], r, V);
    };
    auto write_forward = [this, id, od, op, R](const RowStats& rs, const int32_t* t) {
      for (int64_t r = 0; r < R; ++r) {
        const float v = op == Op::Entropy ? rs.ent[static_cast<size_t>(r)]
                        : op == Op::TokenLogprobs ? rs.target[static_cast<size_t>(r)] - rs.lse[static_cast<size_t>(r)]
                                                  : (rs.arg[static_cast<size_t>(r)] == t[r] ? 1.0f : 0.0f);
        st(p(id), od, r, v);
      }
    };
    // A forward node whose pass an earlier sibling already makes: copy the values out.
    if (!backward) {
      const auto it = pass_groups_.find({h, w});
      if (it != pass_groups_.end() && (tg == kNone || it->second.targets == tg)) {
        auto stats = it->second.stats;
        return [=, this] {
          const int32_t* t = tg != kNone ? static_cast<const int32_t*>(p(tg)) : nullptr;
          write_forward(*stats, t);
        };
      }
    }
    // What the pass computes: for a forward node, everything its later siblings on (h, w) read.
    bool want_ent = entropy, want_arg = op == Op::TokenArgmaxMatch;
    graph::ValueId group_tg = tg;
    if (!backward) {
      for (size_t j = static_cast<size_t>(id) + 1; j < g_.nodes.size(); ++j) {
        const Node& s2 = g_.nodes[j];
        if ((s2.op != Op::TokenLogprobs && s2.op != Op::Entropy && s2.op != Op::TokenArgmaxMatch) || s2.inputs[0] != h || s2.inputs[1] != w) continue;
        const graph::ValueId t2 = s2.op == Op::Entropy ? kNone : s2.inputs[2];
        // Other targets, or targets computed after this node: a pass of its own.
        if (t2 != kNone && ((group_tg != kNone && t2 != group_tg) || t2 > id)) continue;
        if (t2 != kNone) group_tg = t2;
        want_ent = want_ent || s2.op == Op::Entropy;
        want_arg = want_arg || s2.op == Op::TokenArgmaxMatch;
      }
    }
    // logits chunk = h[R,C] · w[j0:j0+c, C]ᵀ ; the last chunk may be shorter.
    const DType hw = dh == dw ? dh : DType::F32;
    auto full = std::make_shared<Gemm>(R, chunk, C, hw, C, 1, hw, 1, C, DType::F32, false, false);
    const int64_t tail = V % chunk;
    auto last = tail ? std::make_shared<Gemm>(R, tail, C, hw, C, 1, hw, 1, C, DType::F32, false, false) : nullptr;
    // The [R, chunk] logits (and, backward in bf16, dz) buffers live in the arena's scratch, not on the heap: a
    // trainer caching a program per length then holds one copy of them, not one per program.
    const size_t logits_at = scratch_bytes_;
    scratch_bytes_ += (static_cast<size_t>(R * chunk) * sizeof(float) + 63) / 64 * 64;
    auto hbuf = std::make_shared<std::vector<float>>(dh != dw ? static_cast<size_t>(R * C) : 0);
    auto wbuf = std::make_shared<std::vector<float>>(dh != dw ? static_cast<size_t>(chunk * C) : 0);
    std::shared_ptr<RowStats> stats;
    bool shared = false;
    if (!backward) {
      stats = std::make_shared<RowStats>();
      pass_groups_[{h, w}] = PassGroup{group_tg, stats};
      if (group_tg != kNone) saved_stats_[{h, w, group_tg}] = stats;
      if (want_ent) saved_stats_[{h, w, graph::ValueId{-2}}] = stats;
    } else if (auto it = saved_stats_.find({h, w, entropy ? graph::ValueId{-2} : tg}); it != saved_stats_.end()) {
      stats = it->second;  // the forward node runs earlier in the same program
      shared = true;
    } else {
      stats = std::make_shared<RowStats>();
    }
    for (auto* v : {&stats->lse, &stats->ent, &stats->target}) v->resize(static_cast<size_t>(R));
    stats->arg.resize(static_cast<size_t>(R));
    // A bf16 model's logits are rounded to bf16 before the loss, so keeping them in bf16 is exact: when a backward
    // node of this pass follows, the forward keeps every chunk in the arena's scratch and the backward reads it
    // back instead of recomputing the lm_head GEMM (R·V·2 bytes, e.g. 311 MB for 1024 rows of Qwen3).
    if (!backward && dh == DType::BF16 && dw == DType::BF16) {
      for (size_t j = static_cast<size_t>(id) + 1; j < g_.nodes.size() && stats->saved < 0; ++j) {
        const Node& s2 = g_.nodes[j];
        const bool match = s2.inputs.size() >= 3 && s2.inputs[0] == h && s2.inputs[1] == w &&
                           ((s2.op == Op::TokenLogprobsBackward && group_tg != kNone && s2.inputs[2] == group_tg) || (s2.op == Op::EntropyBackward && want_ent));
        if (match) {
          stats->saved = static_cast<int64_t>(scratch_bytes_);
          scratch_bytes_ += (static_cast<size_t>(R * V) * 2 + 63) / 64 * 64;
        }
      }
    }
    std::shared_ptr<Gemm> dh_full, dh_last, dw_full, dw_last;
    const bool to16 = backward && hw == DType::BF16;
    const size_t dz16_at = scratch_bytes_;
    if (to16) scratch_bytes_ += (static_cast<size_t>(R * chunk) * sizeof(uint16_t) + 63) / 64 * 64;
    if (backward) {
      dh_full = std::make_shared<Gemm>(R, C, chunk, hw, chunk, 1, hw, C, 1, DType::F32, false, true);
      dw_full = std::make_shared<Gemm>(chunk, C, R, hw, 1, chunk, hw, C, 1, DType::F32, false, false);
      if (tail) {
        dh_last = std::make_shared<Gemm>(R, C, tail, hw, tail, 1, hw, C, 1, DType::F32, false, true);
        dw_last = std::make_shared<Gemm>(tail, C, R, hw, 1, tail, hw, C, 1, DType::F32, false, false);
      }
    }
    return [=, this] {
      float* lg = reinterpret_cast<float*>(scratch(logits_at));
      uint16_t* dz16 = to16 ? reinterpret_cast<uint16_t*>(scratch(dz16_at)) : nullptr;
      const int32_t* t = tg != kNone ? static_cast<const int32_t*>(p(tg)) : nullptr;
      // The pass's targets: this node's, or (an entropy node leading the group) a later sibling's.
      const int32_t* pt = group_tg != kNone ? static_cast<const int32_t*>(p(group_tg)) : nullptr;
      check_targets(pt);
      const char* hp = static_cast<const char*>(p(h));
      if (!hbuf->empty()) {
        for (int64_t i = 0; i < R * C; ++i) (*hbuf)[static_cast<size_t>(i)] = ld(hp, dh, i);
        hp = reinterpret_cast<const char*>(hbuf->data());
      }
      auto chunk_logits = [&](int64_t j0, int64_t c) {
        const char* wp = static_cast<const char*>(p(w)) + j0 * C * static_cast<int64_t>(dtype_size(dw));
        if (!wbuf->empty()) {
          for (int64_t i = 0; i < c * C; ++i) (*wbuf)[static_cast<size_t>(i)] = ld(wp, dw, i);
          wp = reinterpret_cast<const char*>(wbuf->data());
        }
        (c == chunk ? full : last)->run(hp, wp, lg);
      };
      // Logits are stored in the model dtype before the f32 loss (as Transformers does for a bf16 model).
      auto round_row = [dh](float* z, int64_t c) {
        if (dh == DType::BF16) kernels::round_to_bf16(z, c);
        else if (dh != DType::F32)
          for (int64_t j = 0; j < c; ++j) z[j] = rnd(dh, z[j]);
      };
      float* lse = stats->lse.data();
      float* ent = stats->ent.data();
      if (!(backward && shared)) {
        // Pass 1: running max (and its first index), Σ e^(z-m) (and Σ e^(z-m)·z) per row, and the target logit.
        std::vector<float> mx(static_cast<size_t>(R), -INFINITY), sum(static_cast<size_t>(R), 0.0f), tz(static_cast<size_t>(R), 0.0f);
        float* target = stats->target.data();
        int32_t* arg = stats->arg.data();
        uint16_t* keep = stats->saved >= 0 && !backward ? reinterpret_cast<uint16_t*>(scratch(static_cast<size_t>(stats->saved))) : nullptr;
        for (int64_t j0 = 0; j0 < V; j0 += chunk) {
          const int64_t c = std::min(chunk, V - j0);
          chunk_logits(j0, c);
#pragma omp parallel for schedule(static)
          for (int64_t r = 0; r < R; ++r) {
            float* z = lg + r * c;
            round_row(z, c);
            if (keep) kernels::bf16_bits(z, c, keep + R * j0 + r * c);  // exact: z is already bf16
            if (pt && pt[r] >= j0 && pt[r] < j0 + c) target[r] = z[pt[r] - j0];
            float cm = -INFINITY;
            for (int64_t j = 0; j < c; ++j) cm = std::max(cm, z[j]);
            const float old = mx[static_cast<size_t>(r)], m = std::max(old, cm);
            if (want_arg && (cm > old || j0 == 0)) arg[r] = static_cast<int32_t>(j0 + (std::find(z, z + c, cm) - z));
            const float rescale = old == -INFINITY ? 0.0f : std::exp(old - m);
            // z ← e^(z-m) in place (the chunk is recomputed when needed again); Σ e^(z-m)·z = ey + m·Σ e^(z-m).
            float ey = 0;
            const float se = want_ent ? kernels::exp_shift_sum_ey(z, c, m, &ey) : kernels::exp_shift_sum(z, c, m);
            if (want_ent) tz[static_cast<size_t>(r)] = tz[static_cast<size_t>(r)] * rescale + ey + m * se;
            mx[static_cast<size_t>(r)] = m;
            sum[static_cast<size_t>(r)] = sum[static_cast<size_t>(r)] * rescale + se;
          }
        }
        for (int64_t r = 0; r < R; ++r) {
          lse[r] = mx[static_cast<size_t>(r)] + std::log(sum[static_cast<size_t>(r)]);
          ent[r] = lse[r] - tz[static_cast<size_t>(r)] / sum[static_cast<size_t>(r)];
        }
        if (!backward) {
          write_forward(*stats, t);
          return;
        }
      }
      // Pass 2: dz per chunk; dh = Σ dz·w_chunk (accumulated by the GEMM), dw_chunk = dzᵀ·h.
      float* out = static_cast<float*>(p(id));  // packed [dh | dw], f32
      std::fill(out, out + R * C, 0.0f);
      const uint16_t* kept = shared && stats->saved >= 0 ? reinterpret_cast<const uint16_t*>(scratch(static_cast<size_t>(stats->saved))) : nullptr;
      for (int64_t j0 = 0; j0 < V; j0 += chunk) {
        const int64_t c = std::min(chunk, V - j0);
        if (!kept) chunk_logits(j0, c);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < R; ++r) {
          const float g = ld(p(dl), dd, r);
          float* z = lg + r * c;
          uint16_t* z16 = to16 ? dz16 + r * c : nullptr;
          if (kept) {
            const uint16_t* k = kept + R * j0 + r * c;
            for (int64_t j = 0; j < c; ++j) z[j] = bf16_to_f32(k[j]);
          } else {
            round_row(z, c);
          }
          if (entropy) {
            // dz = -g·p·(z - lse + H)
            const float shift = ent[r] - lse[r];
            for (int64_t j = 0; j < c; ++j) {
              const float pj = std::exp(z[j] - lse[r]);
              z[j] = -g * pj * (z[j] + shift);
            }
            if (to16)
              for (int64_t j = 0; j < c; ++j) z16[j] = f32_to_bf16(z[j]);
            continue;
          }
          kernels::exp_shift(z, c, lse[r]);  // softmax of the chunk
          const bool hit = t[r] >= j0 && t[r] < j0 + c;
          if (to16) {
            for (int64_t j = 0; j < c; ++j) z16[j] = f32_to_bf16(-g * z[j]);
            if (hit) z16[t[r] - j0] = f32_to_bf16(g * (1.0f - z[t[r] - j0]));
          } else {
            for (int64_t j = 0; j < c; ++j) z[j] = -g * z[j];
            if (hit) z[t[r] - j0] += g;
          }
        }
        const void* dz = to16 ? static_cast<const void*>(dz16) : static_cast<const void*>(lg);
        const char* wp = static_cast<const char*>(p(w)) + j0 * C * static_cast<int64_t>(dtype_size(dw));
        if (!wbuf->empty()) {  // mixed dtypes: the chunk was widened into wbuf by chunk_logits
          wp = reinterpret_cast<const char*>(wbuf->data());
        }
        (c == chunk ? dh_full : dh_last)->run(dz, wp, out);
        (c == chunk ? dw_full : dw_last)->run(dz, hp, out + R * C + j0 * C);
      }
    };
  }

  Graph g_;
  std::map<std::array<graph::ValueId, 3>, std::shared_ptr<RowStats>> saved_stats_;  // token_logprobs/entropy (h, w, targets|-2)
  std::map<std::pair<graph::ValueId, graph::ValueId>, PassGroup> pass_groups_;        // forward nodes sharing a pass, by (h, w)
  std::vector<void*> ptr_;
  std::vector<bool> inplace_;  // nodes whose output is an input's buffer, updated in place
  std::vector<size_t> offsets_;
  std::vector<std::function<void()>> kernels_;
  std::shared_ptr<Arena> arena_;
  uint64_t bound_version_ = 0;
  size_t arena_bytes_ = 0;   // the planned buffers
  size_t scratch_bytes_ = 0;  // kernels' own state kept between nodes, after the planned buffers
  bool check_guards_ = false;
  bool profile_ = false;
  std::array<double, 64> op_seconds_{};
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o) : shared_(o.share_arena ? std::make_shared<Arena>() : nullptr) {}
  std::string name() const override { return "cpu"; }
  std::unique_ptr<Program> compile(const Graph& graph) override {
    omp_set_num_threads(num_threads());
    ProgramStats stats;
    auto p = std::make_unique<CpuProgram>(graph::eliminate_dead_code(graph), &stats, shared_);
    last_stats_ = stats;
    return p;
  }
  std::unique_ptr<Program> compile_with_plan(const Graph& graph, const std::string& plan, bool* used) override {
    omp_set_num_threads(num_threads());
    ProgramStats stats;
    auto p = std::make_unique<CpuProgram>(graph::eliminate_dead_code(graph), &stats, shared_, &plan, used);
    last_stats_ = stats;
    return p;
  }
  ProgramStats last_stats_;
  std::shared_ptr<Arena> shared_;  // null: each program owns its arena
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(CpuBackendOptions{}); }
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) { return std::make_unique<CpuBackend>(options); }

}  // namespace trl

// MatMul, MatMulNN, MatMulTN, BatchedMatMul on the CPU: oneDNN GEMMs (gemm.h), and a GEMV for a few rows against a weight.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/amx.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel_report.h"
#include "backend/cpu/lower.h"
#include "backend/cpu/vec.h"
#include "core/cpu_features.h"
#include "trl/core/error.h"

namespace trl::cpu {

namespace {

// Rows of x that take the GEMV rather than a GEMM: up to 8 on the vector kernels (vec::dots_bf16*: 8 x 16-lane
// accumulators stay in registers), 2 to 16 on AMX tiles (one C tile is 16 weight rows x up to 16 rows of x). One
// row stays on the vector kernel, which streams the weight a little faster than the tiles (measured: batch-1
// decode 20.5 vs 19.4 tok/s, docs/PERFORMANCE.md).
constexpr int64_t kGemvRowsVec = 8;
// The tiles' tails (N % 16 rows) run on vdpbf16ps: the AMX path also needs AVX512-BF16 (every AMX CPU has it, a VM
// may hide it), and TRL_NO_AVX512BF16=1 turns both off.
bool amx_gemv(DType ta, DType tb, int64_t M, int64_t N, int64_t K) {
  static const bool usable = cpu_features().amx_bf16 && vec::dots_bf16bf16_available();
  return ta == DType::BF16 && tb == DType::BF16 && usable && M >= 2 && M <= amx::kMaxRows && K >= 32 && N >= amx::kBlockRows;
}

// The GEMV's kernels for one (x dtype, w dtype) pair, chosen once when the program is built.
enum class GemvPath { kAmx, kBf16Dot, kWidenX };

// y[m, n] = x[m, :]·w[n, :] (+ bias[n]) (+ addend[m, n]) for M <= 8 (2..16 on AMX tiles): one pass over w, split by rows of w
// across threads.
//   kAmx: blocks of 16 weight rows on the tile unit (amx.h), x packed once per call; the K % 32 columns and the
//     N % 16 rows are finished here with vec::dots_bf16bf16.
//   kBf16Dot: vec::dots_bf16bf16 per weight row (AVX512-BF16).
//   kWidenX: x widened to f32 once, then vec::dots_bf16 (bf16 w) or vec::dot (f32 w) per weight row.
Kernel gemv_node(ProgramContext* cx, graph::ValueId id, graph::ValueId a, graph::ValueId b, graph::ValueId bias, graph::ValueId addend, int64_t M,
                 int64_t N, int64_t K) {
  const DType ta = cx->nd(a).dtype, tb = cx->nd(b).dtype, tc = cx->nd(id).dtype, tbias = bias != kNone ? cx->nd(bias).dtype : DType::F32;
  GemvPath path = GemvPath::kWidenX;
#if defined(__x86_64__)
  if (amx_gemv(ta, tb, M, N, K))
    path = GemvPath::kAmx;
  else if (ta == DType::BF16 && tb == DType::BF16 && vec::dots_bf16bf16_available())
    path = GemvPath::kBf16Dot;
#endif
  if (path != GemvPath::kAmx && M > kGemvRowsVec) fail("internal: a GEMV of {} rows without AMX tiles (at most {})", M, kGemvRowsVec);
  auto xf = std::make_shared<std::vector<float>>(path == GemvPath::kWidenX ? static_cast<size_t>(M * K) : 0);
  auto xp = std::make_shared<std::vector<uint16_t>>(path == GemvPath::kAmx ? amx::packed_x_size(M, K) : 0);
  return [cx, id, a, b, bias, addend, M, N, K, ta, tb, tc, tbias, xf, xp, path] {
    const void* y_in = addend != kNone ? cx->p(addend) : nullptr;
    void* y = cx->p(id);
    // y[:, n] from the dot products of weight row n: + bias, + addend, stored in the result's dtype.
    auto store_column = [&](int64_t n, const float* dots, int64_t dots_stride) {
      const float bv = bias != kNone ? ld(cx->p(bias), tbias, n) : 0.0f;
      for (int64_t m = 0; m < M; ++m) st(y, tc, m * N + n, dots[m * dots_stride] + bv + (y_in ? ld(y_in, tc, m * N + n) : 0.0f));
    };
    // Weight row n on the vector kernels, into dots[0..M).
    const void* x_in = cx->p(a);
    const void* w_all = cx->p(b);
    auto vector_dots = [&](int64_t n, float* dots) {
      const auto* w = static_cast<const uint16_t*>(w_all) + n * K;
#if defined(__x86_64__)
      if (path != GemvPath::kWidenX) return vec::dots_bf16bf16(static_cast<const uint16_t*>(x_in), M, K, w, dots);
#endif
      const float* x = xf->data();
      if (tb == DType::BF16) return vec::dots_bf16(x, M, K, w, dots);
      for (int64_t m = 0; m < M; ++m) dots[m] = vec::dot(x + m * K, static_cast<const float*>(w_all) + n * K, K);
    };

    if (path == GemvPath::kAmx) {
      const auto* x = static_cast<const uint16_t*>(cx->p(a));
      const auto* w = static_cast<const uint16_t*>(cx->p(b));
      amx::pack_x(x, M, K, xp->data());
      const int64_t blocks = N / amx::kBlockRows, k_whole = K / 32 * 32;
#pragma omp parallel
      {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t b0 = blocks * t / threads, b1 = blocks * (t + 1) / threads;
        constexpr int64_t kChunk = 4;  // blocks per call: 64 weight rows, 4 KiB of results on the stack
        alignas(64) float c[kChunk * 256];
        amx::TileScope tiles(M);
        for (int64_t bb = b0; bb < b1; bb += kChunk) {
          const int64_t nb = std::min(kChunk, b1 - bb);
          amx::dots(xp->data(), M, K, w + bb * amx::kBlockRows * K, nb, c);
          for (int64_t r = 0; r < nb * amx::kBlockRows; ++r) {
            const int64_t n = bb * amx::kBlockRows + r;
            float* cr = c + r * 16;
            for (int64_t k = k_whole; k < K; ++k)  // the K % 32 tail
              for (int64_t m = 0; m < M; ++m) cr[m] += bf16_to_f32(x[m * K + k]) * bf16_to_f32(w[n * K + k]);
            store_column(n, cr, 1);
          }
        }
      }
      for (int64_t n = blocks * amx::kBlockRows; n < N; ++n) {  // the N % 16 rows
        float dots[amx::kMaxRows];
        for (int64_t m0 = 0; m0 < M; m0 += kGemvRowsVec)
          vec::dots_bf16bf16(x + m0 * K, std::min(kGemvRowsVec, M - m0), K, w + n * K, dots + m0);
        store_column(n, dots, 1);
      }
      return;
    }

    if (path == GemvPath::kWidenX)
      for (int64_t i = 0; i < M * K; ++i) (*xf)[static_cast<size_t>(i)] = ld(cx->p(a), ta, i);
    // Blocks of weight rows: the dot products of a block first, then its results stored together, so that the
    // per-row work between two streamed rows is the dot product's alone (with a store per row it was ~8% of a
    // batch-1 decode step on the AMD EPYC).
    constexpr int64_t kBlock = 64;
    const bool plain = bias == kNone && y_in == nullptr && (tc == DType::F32 || tc == DType::BF16);
#pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
      const int64_t nn = std::min(kBlock, N - n0);
      float dots[kBlock * kGemvRowsVec];  // [row of w][row of x]
      for (int64_t r = 0; r < nn; ++r) vector_dots(n0 + r, dots + r * M);
      if (!plain) {
        for (int64_t r = 0; r < nn; ++r) store_column(n0 + r, dots + r * M, 1);
        continue;
      }
      for (int64_t m = 0; m < M; ++m) {
        if (tc == DType::F32) {
          float* out = static_cast<float*>(y) + m * N + n0;
          for (int64_t r = 0; r < nn; ++r) out[r] = dots[r * M + m];
        } else {
          uint16_t* out = static_cast<uint16_t*>(y) + m * N + n0;
          for (int64_t r = 0; r < nn; ++r) out[r] = f32_to_bf16(dots[r * M + m]);
        }
      }
    }
  };
}

// GEMM with operands of mixed dtypes: oneDNN takes (bf16|f32)x(bf16|f32) when both match; otherwise the
// lower-precision operand is widened to f32 into a scratch buffer first.
// An addend (MatMul's, MatMulNN's) is accumulated into by the GEMM: copied into the result first, unless the plan
// put the result over it (in place: nothing reads the addend afterwards).
Kernel gemm_node(ProgramContext* cx, graph::ValueId id, graph::ValueId a, graph::ValueId b, graph::ValueId bias, graph::ValueId addend, int64_t M,
                 int64_t N, int64_t K, int64_t sa_m, int64_t sa_k, int64_t sb_k, int64_t sb_n) {
  DType ta = cx->nd(a).dtype, tb = cx->nd(b).dtype;
  const DType tc = cx->nd(id).dtype;
  // A few rows against a weight in nn.Linear layout (decoding) is memory-bound: read each weight row once for
  // all rows (dots_bf16 widens it in registers).
  if ((M <= kGemvRowsVec || amx_gemv(ta, tb, M, N, K)) && sa_m == K && sa_k == 1 && sb_k == 1 && sb_n == K && (tb == DType::BF16 || tb == DType::F32))
    return gemv_node(cx, id, a, b, bias, addend, M, N, K);
  // Mixed operand types: with AVX-512, the bf16 operand widened to f32 for oneDNN's f32 matmul; without it, the
  // backend's own GEMM converts inside its packing (Gemm chooses it: oneDNN has no mixed matmul).
  const bool widen = ta != tb && cpu_features().avx512f;
  const bool widen_a = widen && ta != DType::F32, widen_b = widen && tb != DType::F32;
  if (widen_a) ta = DType::F32;
  if (widen_b) tb = DType::F32;
  auto gemm = std::make_shared<Gemm>(M, N, K, ta, sa_m, sa_k, tb, sb_k, sb_n, tc, bias != kNone, addend != kNone);
  const size_t result_bytes = static_cast<size_t>(M * N) * dtype_size(tc);
  auto scratch_a = std::make_shared<std::vector<float>>(widen_a ? static_cast<size_t>(shape_numel(cx->nd(a).shape)) : 0);
  auto scratch_b = std::make_shared<std::vector<float>>(widen_b ? static_cast<size_t>(shape_numel(cx->nd(b).shape)) : 0);
  auto bias_f32 = std::make_shared<std::vector<float>>(bias != kNone ? static_cast<size_t>(N) : 0);
  const DType oa = cx->nd(a).dtype, ob = cx->nd(b).dtype, obias = bias != kNone ? cx->nd(bias).dtype : DType::F32;
  return [cx, id, a, b, bias, addend, result_bytes, gemm, scratch_a, scratch_b, bias_f32, oa, ob, obias] {
    if (addend != kNone && cx->p(addend) != cx->p(id)) std::memcpy(cx->p(id), cx->p(addend), result_bytes);
    const void* pa = cx->p(a);
    const void* pb = cx->p(b);
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
      for (size_t i = 0; i < bias_f32->size(); ++i) (*bias_f32)[i] = ld(cx->p(bias), obias, static_cast<int64_t>(i));
      pbias = bias_f32->data();
    }
    gemm->run(pa, pb, cx->p(id), pbias);
  };
}

}  // namespace

std::string gemv_kernel() {
#if defined(__x86_64__)
  if (amx_gemv(DType::BF16, DType::BF16, 2, 64, 64)) return "amx (2-16 rows) + avx512bf16";
  if (vec::dots_bf16bf16_available()) return "avx512bf16";
#endif
  return "dot products (" + clone_family() + ")";
}

// y[M,N] = x[M,K]·w[N,K]ᵀ + b
Kernel lower_matmul(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const graph::ValueId x = n.inputs[0], w = n.inputs[1], b = n.inputs[2];
  const int64_t K = cx->nd(x).shape.back(), M = shape_numel(cx->nd(x).shape) / K, N = cx->nd(w).shape[0];
  const graph::ValueId addend = n.inputs.size() > 3 ? n.inputs[3] : kNone;
  return gemm_node(cx, id, x, w, b, addend, M, N, K, /*a row-major*/ K, 1, /*b = wᵀ*/ 1, K);
}

// y[M,K] = dy[M,N]·w[N,K]
Kernel lower_matmul_nn(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const graph::ValueId a = n.inputs[0], w = n.inputs[1];
  const int64_t N = cx->nd(w).shape[0], K = cx->nd(w).shape[1], M = shape_numel(cx->nd(a).shape) / N;
  const graph::ValueId addend = n.inputs.size() > 2 ? n.inputs[2] : kNone;
  return gemm_node(cx, id, a, w, kNone, addend, M, K, N, N, 1, K, 1);
}

// y[N,K] = a[R,N]ᵀ·b[R,K]
Kernel lower_matmul_tn(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const graph::ValueId a = n.inputs[0], b = n.inputs[1];
  const int64_t N = cx->nd(a).shape.back(), K = cx->nd(b).shape.back(), R = shape_numel(cx->nd(a).shape) / N;
  return gemm_node(cx, id, a, b, kNone, kNone, N, K, R, 1, N, K, 1);
}

// out[e] = op(a[e])·op(b[e]) for e < E: one GEMM shape (a oneDNN primitive, threaded inside) run once per e over
// the e-th slices. LoRA's ΔW_e = B_e·A_e of stacked experts and its two backward products.
Kernel lower_batched_matmul(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const graph::ValueId a = n.inputs[0], b = n.inputs[1];
  const Shape &as = cx->nd(a).shape, &bs = cx->nd(b).shape;
  const int64_t E = n.shape[0], M = n.shape[1], N = n.shape[2], K = n.attrs.trans_a ? as[1] : as[2];
  // a_e: [M, K] row-major, or [K, M] read transposed; b_e: [K, N], or [N, K] read transposed.
  const int64_t sa_m = n.attrs.trans_a ? 1 : K, sa_k = n.attrs.trans_a ? M : 1;
  const int64_t sb_k = n.attrs.trans_b ? 1 : N, sb_n = n.attrs.trans_b ? K : 1;
  const DType ta = cx->nd(a).dtype, tb = cx->nd(b).dtype, tc = n.dtype;
  auto gemm = std::make_shared<Gemm>(M, N, K, ta, sa_m, sa_k, tb, sb_k, sb_n, tc, false, false);
  const size_t a_step = static_cast<size_t>(as[1] * as[2]) * dtype_size(ta), b_step = static_cast<size_t>(bs[1] * bs[2]) * dtype_size(tb),
               c_step = static_cast<size_t>(M * N) * dtype_size(tc);
  return [cx, id, a, b, E, gemm, a_step, b_step, c_step] {
    const char* pa = static_cast<const char*>(cx->p(a));
    const char* pb = static_cast<const char*>(cx->p(b));
    char* pc = static_cast<char*>(cx->p(id));
    for (int64_t e = 0; e < E; ++e) gemm->run(pa + static_cast<size_t>(e) * a_step, pb + static_cast<size_t>(e) * b_step, pc + static_cast<size_t>(e) * c_step);
  };
}

}  // namespace trl::cpu

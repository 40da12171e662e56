// MatMul, MatMulNN, MatMulTN on the CPU: oneDNN GEMMs (gemm.h), and a GEMV for a few rows against a weight.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/lower.h"
#include "backend/cpu/vec.h"
#include "core/cpu_features.h"
#include "trl/core/error.h"

namespace trl::cpu {

namespace {

constexpr int64_t kGemvRows = 8;

// y[m, n] = x[m, :]·w[n, :] (+ bias[n]) for M <= kGemvRows: one pass over w, split by rows of w across threads.
Kernel gemv_node(ProgramContext* cx, graph::ValueId id, graph::ValueId a, graph::ValueId b, graph::ValueId bias, graph::ValueId addend, int64_t M,
                 int64_t N, int64_t K) {
  const DType ta = cx->nd(a).dtype, tb = cx->nd(b).dtype, tc = cx->nd(id).dtype, tbias = bias != kNone ? cx->nd(bias).dtype : DType::F32;
  auto xf = std::make_shared<std::vector<float>>(static_cast<size_t>(M * K));
#if defined(__x86_64__)
  const bool bf16dot = ta == DType::BF16 && tb == DType::BF16 && cpu_features().avx512bf16 && !std::getenv("TRL_NO_AVX512BF16");
#else
  const bool bf16dot = false;
#endif
  return [cx, id, a, b, bias, addend, M, N, K, ta, tb, tc, tbias, xf, bf16dot] {
    if (!bf16dot)
      for (int64_t i = 0; i < M * K; ++i) (*xf)[static_cast<size_t>(i)] = ld(cx->p(a), ta, i);
    const float* x = xf->data();
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const float bv = bias != kNone ? ld(cx->p(bias), tbias, n) : 0.0f;
        float dots[kGemvRows];
#if defined(__x86_64__)
        if (bf16dot) {
          vec::dots_bf16bf16(static_cast<const uint16_t*>(cx->p(a)), M, K, static_cast<const uint16_t*>(cx->p(b)) + n * K, dots);
        } else
#endif
        if (tb == DType::BF16 && M == 1) {
          dots[0] = vec::dot_bf16(x, static_cast<const uint16_t*>(cx->p(b)) + n * K, K);
        } else if (tb == DType::BF16) {
          vec::dots_bf16(x, M, K, static_cast<const uint16_t*>(cx->p(b)) + n * K, dots);
        } else {
          for (int64_t m = 0; m < M; ++m) dots[m] = vec::dot(x + m * K, static_cast<const float*>(cx->p(b)) + n * K, K);
        }
        for (int64_t m = 0; m < M; ++m) st(cx->p(id), tc, m * N + n, dots[m] + bv + (addend != kNone ? ld(cx->p(addend), tc, m * N + n) : 0.0f));
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
  if (M <= kGemvRows && sa_m == K && sa_k == 1 && sb_k == 1 && sb_n == K && (tb == DType::BF16 || tb == DType::F32))
    return gemv_node(cx, id, a, b, bias, addend, M, N, K);
  const bool widen_a = ta != tb && ta != DType::F32, widen_b = ta != tb && tb != DType::F32;
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

}  // namespace trl::cpu

// Elementwise and reduction ops on the CPU: add, scale_by, dropout, swiglu and its backward, weighted_sum, sum_rows.
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
#include "core/rng.h"
#include "trl/core/error.h"

namespace trl::cpu {

// a,b: same shape -> a + b
Kernel lower_add(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId a = n.inputs[0], b = n.inputs[1];
  const DType da = cx->nd(a).dtype, db = cx->nd(b).dtype;
  const int64_t count = shape_numel(n.shape);
  return [cx, id, a, b, da, db, od, count] {
    if (da == DType::F32 && db == DType::F32 && od == DType::F32) {
      const float* x = static_cast<const float*>(cx->p(a));
      const float* y = static_cast<const float*>(cx->p(b));
      float* z = static_cast<float*>(cx->p(id));
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) z[i] = x[i] + y[i];
      return;
    }
    if (da == DType::BF16 && db == DType::BF16 && od == DType::BF16) {  // the residual stream and LoRA's branch
      const uint16_t* x = static_cast<const uint16_t*>(cx->p(a));
      const uint16_t* y = static_cast<const uint16_t*>(cx->p(b));
      uint16_t* z = static_cast<uint16_t*>(cx->p(id));
      constexpr int64_t kBlock = 8192;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; i += kBlock) vec::add_bf16(x + i, y + i, std::min(kBlock, count - i), z + i);
      return;
    }
    dispatch(da, cx->p(a), db, cx->p(b), od, cx->p(id), [&](auto x, auto y, auto z) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) z.st(i, x.ld(i) + y.ld(i));
    });
  };
}

// w:[...], s:[] -> w·s
Kernel lower_scale_by(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId a = n.inputs[0], s = n.inputs[1];
  const DType da = cx->nd(a).dtype, ds = cx->nd(s).dtype;
  const int64_t count = shape_numel(n.shape);
  return [cx, id, a, s, da, ds, od, count] {
    const float sc = ld(cx->p(s), ds, 0);
    dispatch(da, cx->p(a), od, cx->p(id), [&](auto x, auto z) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) z.st(i, sc * x.ld(i));
    });
  };
}

// x:[...], seed:[2] i32 -> x·keep/(1 − p); keep from the counter-based hash of (seed, stream, element index)
Kernel lower_dropout(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId x = n.inputs[0], s = n.inputs[1];
  const DType dx = cx->nd(x).dtype;
  const int64_t count = shape_numel(n.shape), stream = n.attrs.offset;
  const uint32_t threshold = dropout_threshold(n.attrs.value);
  const float keep_scale = static_cast<float>(1.0 / (1.0 - n.attrs.value));
  return [cx, id, x, s, dx, od, count, stream, threshold, keep_scale] {
    const uint64_t seed = dropout_seed(static_cast<const int32_t*>(cx->p(s)));
    dispatch(dx, cx->p(x), od, cx->p(id), [&](auto in, auto out) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) out.st(i, dropout_keep(seed, stream, i, threshold) ? keep_scale * in.ld(i) : 0.0f);
    });
  };
}

// gate,up:[...,F] -> silu(gate)·up (silu rounded to the gate dtype first, as Transformers does)
Kernel lower_swiglu(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId a = n.inputs[0], b = n.inputs[1];
  const DType da = cx->nd(a).dtype, db = cx->nd(b).dtype;
  const int64_t count = shape_numel(n.shape);
  const bool fast = da == DType::BF16 && db == DType::BF16 && od == DType::BF16 && vec::swiglu_bf16_available();
  return [cx, id, a, b, da, db, od, count, fast] {
    if (fast) {  // bf16 training: the AVX-512 kernel, in chunks of 4096 across the threads
      const auto* g = static_cast<const uint16_t*>(cx->p(a));
      const auto* u = static_cast<const uint16_t*>(cx->p(b));
      auto* out = static_cast<uint16_t*>(cx->p(id));
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; i += 4096) vec::swiglu_bf16(g + i, u + i, std::min<int64_t>(4096, count - i), out + i);
      return;
    }
    dispatch(da, cx->p(a), db, cx->p(b), od, cx->p(id), [&](auto ga, auto ub, auto out) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) {
        const float g = ga.ld(i);
        out.st(i, ga.round(g / (1.0f + std::exp(-g))) * ub.ld(i));
      }
    });
  };
}

// gate, up, dy:[...,F] -> packed [dgate | dup]
Kernel lower_swiglu_backward(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId a = n.inputs[0], b = n.inputs[1], dy = n.inputs[2];
  const DType da = cx->nd(a).dtype, db = cx->nd(b).dtype, dd = cx->nd(dy).dtype;
  const int64_t count = shape_numel(cx->nd(a).shape);
  const bool fast = da == DType::BF16 && db == DType::BF16 && dd == DType::BF16 && od == DType::BF16 && vec::swiglu_bf16_available();
  return [cx, id, a, b, dy, da, db, dd, od, count, fast] {
    if (fast) {  // bf16 training: the AVX-512 kernel, in chunks of 4096 across the threads
      const auto* g = static_cast<const uint16_t*>(cx->p(a));
      const auto* u = static_cast<const uint16_t*>(cx->p(b));
      const auto* d = static_cast<const uint16_t*>(cx->p(dy));
      auto* out = static_cast<uint16_t*>(cx->p(id));
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; i += 4096) {
        const int64_t c = std::min<int64_t>(4096, count - i);
        vec::swiglu_backward_bf16(g + i, u + i, d + i, c, out + i, out + count + i);
      }
      return;
    }
    const DType pair = da == db ? da : DType::F64;  // gate and up share a dtype in practice (else: any-dtype loads)
    dispatch(pair, cx->p(a), dd, cx->p(dy), od, cx->p(id), [&](auto ga, auto dya, auto out) {
      auto ub = ga;
      ub.p = static_cast<decltype(ga.p)>(cx->p(b));
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

// x:[...], weights:[...] -> [] Σ x·weights (f64 accumulation)
Kernel lower_weighted_sum(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId a = n.inputs[0], w = n.inputs[1];
  const DType da = cx->nd(a).dtype, dw = cx->nd(w).dtype;
  const int64_t count = shape_numel(cx->nd(a).shape);
  return [cx, id, a, w, da, dw, od, count] {
    double acc = 0;
    for (int64_t i = 0; i < count; ++i) acc += static_cast<double>(ld(cx->p(a), da, i)) * ld(cx->p(w), dw, i);
    st(cx->p(id), od, 0, static_cast<float>(acc));
  };
}

// x: [..., N] (R rows of N) -> out[c] = Σ_r x[r, c]: a bias's gradient, or the column sums of a [V, C] weight
// (311 MB of bf16 for Qwen3's lm_head). Blocks of 32 columns in parallel, rows inner, so each cache line of a row
// is read once while the block's sums stay in registers; each column still sums its rows in order (r = 0, 1, ...).
Kernel lower_sum_rows(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId a = n.inputs[0];
  const DType da = cx->nd(a).dtype;
  const int64_t N = cx->nd(a).shape.back(), R = shape_numel(cx->nd(a).shape) / N;
  static constexpr int64_t kBlock = 32;
  return [cx, id, a, da, od, N, R] {
    const int64_t blocks = (N + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t c0 = blk * kBlock, width = std::min(kBlock, N - c0);
      float acc[kBlock] = {};
      dispatch(da, cx->p(a), [&](auto x) {
        if (width == kBlock)
          for (int64_t r = 0; r < R; ++r)
            for (int64_t j = 0; j < kBlock; ++j) acc[j] += x.ld(r * N + c0 + j);
        else
          for (int64_t r = 0; r < R; ++r)
            for (int64_t j = 0; j < width; ++j) acc[j] += x.ld(r * N + c0 + j);
      });
      for (int64_t j = 0; j < width; ++j) st(cx->p(id), od, c0 + j, acc[j]);
    }
  };
}

}  // namespace trl::cpu

// RmsNorm and its backward (RmsNormBackX, RmsNormBackW) on the CPU.
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

// x:[...,C], w:[C] -> [...,C]: x·rsqrt(mean(x²) + eps) in f32 (sum of squares in f64), rounded to x's dtype, then ·w.
Kernel lower_rms_norm(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const graph::ValueId x = n.inputs[0], w = n.inputs[1];
  const int64_t C = n.shape.back(), R = shape_numel(n.shape) / C;
  const DType dx = cx->nd(x).dtype, dw = cx->nd(w).dtype, od = n.dtype;
  const float eps = static_cast<float>(n.attrs.eps);
  auto wf = std::make_shared<std::vector<float>>(static_cast<size_t>(C));
  return [cx, id, x, w, C, R, dx, dw, od, eps, wf] {
    for (int64_t c = 0; c < C; ++c) (*wf)[static_cast<size_t>(c)] = ld(cx->p(w), dw, c);
    const float* wv = wf->data();
    dispatch(dx, cx->p(x), od, cx->p(id), [&](auto xa, auto out) {
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        const double ss = sum_squares(xa, r * C, C);
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
        for (int64_t c = 0; c < C; ++c) out.st(r * C + c, xa.round(xa.ld(r * C + c) * inv) * wv[c]);
      }
    });
  };
}

// RmsNormBackX: x, w, dy:[...,C] -> dx = inv·w·dy − x·inv³/C·Σ(w·dy·x); RmsNormBackW: x, dy -> dw:[C] = Σ_rows dy·x·inv
// (per-thread f64 partial sums, added in thread order: deterministic for a given thread count).
Kernel lower_rms_norm_backward(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const bool want_x = n.op == Op::RmsNormBackX;
  const graph::ValueId x = n.inputs[0], w = want_x ? n.inputs[1] : kNone, dy = want_x ? n.inputs[2] : n.inputs[1];
  const int64_t C = cx->nd(x).shape.back(), R = shape_numel(cx->nd(x).shape) / C;
  const DType dx = cx->nd(x).dtype, dw = w != kNone ? cx->nd(w).dtype : DType::F32, dd = cx->nd(dy).dtype, od = n.dtype;
  const double eps = n.attrs.eps;
  auto acc = std::make_shared<std::vector<double>>();
  auto wf = std::make_shared<std::vector<float>>(static_cast<size_t>(C));
  return [cx, id, x, w, dy, C, R, dx, dw, dd, od, eps, want_x, acc, wf] {
    if (want_x) {
      for (int64_t c = 0; c < C; ++c) (*wf)[static_cast<size_t>(c)] = ld(cx->p(w), dw, c);
      const float* wv = wf->data();
      dispatch(dx, cx->p(x), dd, cx->p(dy), od, cx->p(id), [&](auto xa, auto ga, auto out) {
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
      dispatch(dx, cx->p(x), dd, cx->p(dy), [&](auto xa, auto ga) {
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
      st(cx->p(id), od, c, static_cast<float>(s));
    }
  };
}

}  // namespace trl::cpu

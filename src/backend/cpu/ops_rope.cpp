// Rope on the CPU: rotate-half (GPT-NeoX) layout, cos/sin in the model dtype as Transformers rounds them.
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

// x:[B,T,H,D], positions:[B,T] i32 -> [B,T,H,D]: (x1, x2) ← (x1·cos − x2·sin, x2·cos + x1·sin) per half of D, with
// cos/sin (times attention_scaling) rounded to x's dtype first; attrs.inverse rotates by −angle (the VJP).
Kernel lower_rope(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const graph::ValueId x = n.inputs[0], pos = n.inputs[1];
  const int64_t B = n.shape[0], T = n.shape[1], H = n.shape[2], D = n.shape[3], half = D / 2;
  const DType dx = cx->nd(x).dtype, od = n.dtype;
  const auto a = n.attrs;
  if (D % 2 != 0 || static_cast<int64_t>(a.inv_freq.size()) != half)
    fail("rope {}: head_dim {} needs {} inverse frequencies, the node has {}", n.name, D, half, a.inv_freq.size());
  return [cx, id, x, pos, B, T, H, D, half, dx, od, a] {
    const int32_t* ps = static_cast<const int32_t*>(cx->p(pos));
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const float pf = static_cast<float>(ps[bt]);
      thread_local std::vector<float> cos_sin;
      cos_sin.resize(static_cast<size_t>(2 * half));
      float* cs = cos_sin.data();
      float* sn = cs + half;
      for (int64_t j = 0; j < half; ++j) {
        const float angle = pf * a.inv_freq[static_cast<size_t>(j)];
        cs[j] = rnd(dx, static_cast<float>(std::cos(static_cast<double>(angle)) * a.rope_scaling));
        sn[j] = rnd(dx, static_cast<float>(std::sin(static_cast<double>(angle)) * a.rope_scaling)) * (a.inverse ? -1.0f : 1.0f);
      }
      dispatch(dx, cx->p(x), od, cx->p(id), [&](auto xa, auto out) {
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

}  // namespace trl::cpu

// AdamW's per-element update (Backend::adamw_step), the portable loop every backend's kernel must equal bit for bit:
// the CPU's AVX-512 and AVX2 kernels (backend/cpu/adamw.cpp) run these operations in this order and use it for
// their heads and tails; the host default of Backend::adamw_step (backend.cpp) is this loop over OpenMP threads.
#pragma once

#include <cmath>
#include <cstdint>

#include "trl/backend/backend.h"
#include "trl/core/dtype.h"

// No contraction of a multiply and an add into one fused multiply-add in a function: GCC's attribute; clang has no
// such attribute and builds every file with -ffp-contract=off (CMakeLists.txt).
#if defined(__clang__)
#define TRL_NO_FP_CONTRACT
#else
#define TRL_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif

namespace trl {

// Elements [i0, i1): gradient g, moments m, v (read unless fresh: then they start at 0), the f32 weight w and its
// bf16 compute copy w16 (when not null). No fused multiply-add (GCC would otherwise contract mul + add in one
// kernel and not the other), so that every kernel gives the same bits.
template <bool kFresh>
TRL_NO_FP_CONTRACT inline void adamw_update_scalar(const float* g, float* m, float* v, float* w, uint16_t* w16,
                                                                             int64_t i0, int64_t i1, const Backend::AdamWStep& u) {
  for (int64_t i = i0; i < i1; ++i) {
    const float gi = g[i];
    const float m0 = kFresh ? 0.0f : m[i], v0 = kFresh ? 0.0f : v[i];
    const float mi = m0 + (1.0f - u.b1) * (gi - m0);
    const float vi = u.b2 * v0 + (1.0f - u.b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float wi = w[i] * u.keep - u.step_size * mi / (std::sqrt(vi) * u.inv_sqrt_bc2 + u.eps);
    w[i] = wi;
    if (w16 != nullptr) w16[i] = f32_to_bf16(wi);
  }
}

// The arrays of one adamw_step, its arguments checked (check_adamw_step): what every kernel loops over.
struct AdamWArrays {
  const float* g;
  float *m, *v, *w;
  uint16_t* w16;  // null: no compute copy
  int64_t n;
};
inline AdamWArrays adamw_arrays(const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& weight, Tensor* compute) {
  check_adamw_step(grad, exp_avg, exp_avg_sq, weight, compute);
  return {grad.data_as<float>(), exp_avg.mutable_data_as<float>(), exp_avg_sq.mutable_data_as<float>(), weight.mutable_data_as<float>(),
          compute != nullptr ? compute->mutable_data_as<uint16_t>() : nullptr, weight.numel()};
}

}  // namespace trl

// AdamW's step on the CPU backend (Backend::adamw_step), vectorised for AVX-512 and AVX2 with the portable loop's bits.
#pragma once

#include "trl/backend/backend.h"

namespace trl::cpu {

// The kernel family on this CPU: "avx512", "avx2" or "portable".
const char* adamw_kernel();

void adamw_step(const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& weight, Tensor* compute, const Backend::AdamWStep& step);

}  // namespace trl::cpu

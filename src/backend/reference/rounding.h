// The reference backend's rounding: a value as storing it in a dtype would keep it (Transformers' rounding points).
#pragma once

#include "trl/core/dtype.h"

namespace trl::reference {

inline double rnd(DType dtype, double v) {
  switch (dtype) {
    case DType::BF16: return round_bf16(static_cast<float>(v));
    case DType::F16: return f16_to_f32(f32_to_f16(static_cast<float>(v)));
    case DType::F32: return static_cast<float>(v);
    default: return v;
  }
}

}  // namespace trl::reference

// Typed element access for the CPU backend's memory-bound kernels. A kernel is written once as a template over
// accessors; dispatch() instantiates it for the dtypes that occur in practice (f32, bf16) so that the inner loops
// are plain typed loads and stores the compiler vectorises, with a run-time-dtype accessor for everything else.
#pragma once

#include <cstdint>

#include "trl/core/dtype.h"

namespace trl::cpu {

// Loads and stores through void* for any dtype (the slow path; integers read as floats, stores to integers ignored).
inline float load_any(const void* p, DType dt, int64_t i) {
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
inline void store_any(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    default: break;
  }
}
// Short names for the kernels' slow paths.
inline float ld(const void* p, DType dt, int64_t i) { return load_any(p, dt, i); }
inline void st(void* p, DType dt, int64_t i, float v) { store_any(p, dt, i, v); }
// The value storing `v` in `dt` keeps (the rounding points of Transformers' eager model, as in the reference).
inline float rnd(DType dt, float v) {
  if (dt == DType::BF16) return round_bf16(v);
  if (dt == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

struct F32Acc {
  float* p;
  float ld(int64_t i) const { return p[i]; }
  void st(int64_t i, float v) const { p[i] = v; }
  // The value a store would keep (Transformers' rounding points): identity for f32.
  static float round(float v) { return v; }
};
struct BF16Acc {
  uint16_t* p;
  float ld(int64_t i) const { return bf16_to_f32(p[i]); }
  void st(int64_t i, float v) const { p[i] = f32_to_bf16(v); }
  static float round(float v) { return round_bf16(v); }
};
struct AnyAcc {
  void* p;
  DType dt;
  float ld(int64_t i) const { return load_any(p, dt, i); }
  void st(int64_t i, float v) const { store_any(p, dt, i, v); }
  float round(float v) const {
    if (dt == DType::BF16) return round_bf16(v);
    if (dt == DType::F16) return f16_to_f32(f32_to_f16(v));
    return v;
  }
};

// Calls f(accessor) with the accessor type for `dt`.
template <class F>
void dispatch(DType dt, const void* p, F&& f) {
  void* q = const_cast<void*>(p);
  switch (dt) {
    case DType::F32: f(F32Acc{static_cast<float*>(q)}); return;
    case DType::BF16: f(BF16Acc{static_cast<uint16_t*>(q)}); return;
    default: f(AnyAcc{q, dt}); return;
  }
}
// The same for two or three operands (instantiates every combination of f32 / bf16 / any).
template <class F>
void dispatch(DType d0, const void* p0, DType d1, const void* p1, F&& f) {
  dispatch(d0, p0, [&](auto a0) { dispatch(d1, p1, [&](auto a1) { f(a0, a1); }); });
}
template <class F>
void dispatch(DType d0, const void* p0, DType d1, const void* p1, DType d2, const void* p2, F&& f) {
  dispatch(d0, p0, [&](auto a0) { dispatch(d1, p1, [&](auto a1) { dispatch(d2, p2, [&](auto a2) { f(a0, a1, a2); }); }); });
}

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

}  // namespace trl::cpu

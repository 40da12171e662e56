// Typed element access for the CPU backend's memory-bound kernels. A kernel is written once as a template over
// accessors; dispatch() instantiates it for the dtypes that occur in practice (f32, bf16) so that the inner loops
// are plain typed loads and stores the compiler vectorises, with a run-time-dtype accessor for everything else.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace trl::cpu {

// Loads and stores through void* for any dtype (the slow path; integers read as floats).
float load_any(const void* p, DType dt, int64_t i);
void store_any(void* p, DType dt, int64_t i, float v);

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

}  // namespace trl::cpu

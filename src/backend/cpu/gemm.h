// GEMM of the CPU backend: one oneDNN matmul primitive per shape, created at compile time and shared between the
// programs and layers that use the same shape (a 28-layer model needs ~20 distinct GEMMs, not 600).
#pragma once

#include <cstdint>

#include <dnnl.hpp>

#include "backend/cpu/gemm_packed.h"
#include "trl/core/dtype.h"

namespace trl::cpu {

// The process's oneDNN CPU engine.
const dnnl::engine& dnnl_engine();

// C[M,N] (+)= op(A)·op(B) with A, B given by strides, as one oneDNN matmul primitive fixed at construction.
// Where oneDNN has no matmul for the operand types on this CPU (bf16 without AVX-512: oneDNN 2.6 needs avx512_core
// for it), the GEMM is the backend's own (gemm_packed.h: bf16 converted to f32 in its packing, f32 accumulation),
// chosen here at compile time; kernel() says which runs.
class Gemm {
 public:
  // a: M×K with strides (sa_m, sa_k); b: K×N with strides (sb_k, sb_n); c: M×N with row stride ldc (0 = N).
  // Optional bias [N] f32; accumulate: C += A·B instead of C = A·B.
  Gemm(int64_t M, int64_t N, int64_t K, DType ta, int64_t sa_m, int64_t sa_k, DType tb, int64_t sb_k, int64_t sb_n, DType tc, bool bias,
       bool accumulate, int64_t ldc = 0);
  // Safe to call from several threads at once: each thread executes on its own oneDNN stream and scratchpad.
  void run(const void* a, const void* b, void* c, const void* bias = nullptr) const;

  int64_t flops() const { return 2 * M_ * N_ * K_; }
  // "onednn", or the packed GEMM's micro-kernel family ("avx2", "portable").
  const char* kernel() const;

 private:
  bool create(DType ta, int64_t sa_m, int64_t sa_k, DType tb, int64_t sb_k, int64_t sb_n, DType tc, int64_t ldc, bool bias, bool accumulate);

  int64_t M_, N_, K_, ldc_;
  bool packed_ = false;  // oneDNN has no primitive for these types here: packed_gemm_ runs instead
  PackedGemm packed_gemm_;
  dnnl::memory::desc a_, b_, c_, bias_, scratch_md_;
  dnnl::matmul prim_;
  bool has_bias_ = false, accumulate_ = false;
};

}  // namespace trl::cpu

// The CPU backend's own GEMM, for operand types oneDNN has no matmul for on this CPU (bf16 without AVX-512:
// oneDNN 2.6's bf16 matmul needs avx512_core). Operands in f32 or bf16 with any strides are converted to f32 while
// they are packed into cache-sized panels (never a whole f32 copy of an operand), multiplied on a 6×16 register tile
// with f32 accumulation over the whole of K, and each result is stored once, in f32 or bf16.
//
// Blocking (GotoBLAS): C is cut into tiles of kMc rows × kNc columns, one task each (OpenMP, unless the caller is
// already inside a parallel region). A task walks K in blocks of kKc: it packs its A block (kMc × kKc, 6-row
// panels, L2) once per block, and for each 16-column panel of B (kKc × 16, L1) runs the micro-kernel down the A
// block, accumulating into an f32 tile of the task.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trl/core/dtype.h"

namespace trl::cpu {

// The micro-kernel families: AVX2 + FMA intrinsics, or portable C++ (any x86-64 or other CPU).
enum class PackedKernel { kAvx2, kPortable };
// The best family this CPU runs (cpu_features()), and its name ("avx2" or "portable").
PackedKernel best_packed_kernel();
const char* packed_kernel_name(PackedKernel k);

struct PackedGemm {
  int64_t M = 0, N = 0, K = 0;
  DType ta = DType::F32;  // A: M×K, element (m, k) at a[m·sa_m + k·sa_k]
  int64_t sa_m = 0, sa_k = 1;
  DType tb = DType::F32;  // B: K×N, element (k, n) at b[k·sb_k + n·sb_n]
  int64_t sb_k = 0, sb_n = 1;
  DType tc = DType::F32;  // C: M×N, element (m, n) at c[m·ldc + n]
  int64_t ldc = 0;
  PackedKernel kernel = best_packed_kernel();

  // C = A·B (+ bias[n], f32) (+ C's old value when accumulate), summed in f32 and rounded once into tc.
  // ta, tb: f32 or bf16; tc: f32 or bf16. Safe to call from several threads at once.
  void run(const void* a, const void* b, void* c, const float* bias, bool accumulate) const;
};

}  // namespace trl::cpu

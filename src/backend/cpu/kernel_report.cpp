#include "backend/cpu/kernel_report.h"

#include <dnnl.hpp>

#include "backend/cpu/adamw.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/vec.h"
#include "core/sanitizers.h"

namespace trl::cpu {

namespace {

// oneDNN's effective ISA (its own dispatch, capped by ONEDNN_MAX_CPU_ISA).
std::string onednn_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

}  // namespace

// GCC's own CPU test, as target_clones' resolvers use it (so TRL_NO_AVX512 does not change it).
std::string clone_family() {
#if defined(__x86_64__) && !TRL_ASAN
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
  return "portable";
}

std::vector<std::pair<std::string, std::string>> kernel_families() {
  // A GEMM of each operand type, created as the backend creates them: oneDNN's primitive where it has one.
  const Gemm f32(64, 64, 64, DType::F32, 64, 1, DType::F32, 1, 64, DType::F32, false, false);
  const Gemm bf16(64, 64, 64, DType::BF16, 64, 1, DType::BF16, 1, 64, DType::F32, false, false);
  auto gemm_family = [](const Gemm& g) {
    const std::string k = g.kernel();
    return k == "onednn" ? "onednn (" + onednn_isa() + ")" : k + " (packed, bf16 converted in the packing)";
  };
  return {{"gemm f32", gemm_family(f32)},
          {"gemm bf16", gemm_family(bf16)},
          {"gemv (decoding)", gemv_kernel()},
          {"exp, softmax, swiglu", vec::exp_kernel()},
          {"row kernels", clone_family()},
          {"adamw", adamw_kernel()}};
}

}  // namespace trl::cpu

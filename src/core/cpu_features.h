// Run-time detection of the instruction sets the kernels may use. We never build with -march=native: a binary
// built here must run on any x86-64 machine, and picks its kernels from what this function reports.
#pragma once

#include <string>

namespace trl {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
  // AMX-BF16 tiles usable by this process: the CPU has AMX-TILE and AMX-BF16, the OS saves the tile state (XCR0
  // bits 17, 18), and Linux granted the permission (arch_prctl ARCH_REQ_XCOMP_PERM, asked for once here).
  // TRL_NO_AMX=1 turns it off.
  bool amx_bf16 = false;
  std::string vendor;
  std::string brand;
};

const CpuFeatures& cpu_features();
// The best kernel family this CPU supports: "avx512bf16", "avx512", "avx2" or "scalar".
std::string best_isa();

}  // namespace trl

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
  std::string vendor;
  std::string brand;
};

const CpuFeatures& cpu_features();
// The best kernel family this CPU supports: "avx512bf16", "avx512", "avx2" or "scalar".
std::string best_isa();

}  // namespace trl

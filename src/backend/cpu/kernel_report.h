// Which kernel family each hot op of the CPU backend runs on this CPU (`trl env`, `trl bench`): the choice is made
// at run time from cpu_features(), oneDNN's own dispatch and GCC's target_clones, so it differs between machines.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace trl::cpu {

// (hot op, family) pairs in a fixed order, e.g. ("gemm bf16", "avx2 (packed, bf16 converted in the packing)").
std::vector<std::pair<std::string, std::string>> kernel_families();

// The clone GCC's target_clones picks for the vectorised row kernels on this CPU: "avx512", "avx2" or "portable".
std::string clone_family();

// The GEMV of decoding (ops_matmul.cpp): "amx + avx512bf16", "avx512bf16" or "dot products (<clone>)".
std::string gemv_kernel();

}  // namespace trl::cpu

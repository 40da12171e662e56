// The CPU backend (oneDNN GEMM, planned arena, OpenMP-parallel f32 kernels). See cpu_backend.cpp.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace trl {

struct ProgramStats {
  size_t arena_bytes = 0;       // the planned arena of one program
  double compile_seconds = 0;   // time to plan and lower it
};

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace trl

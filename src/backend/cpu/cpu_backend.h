// The CPU backend (oneDNN GEMM, planned arena, OpenMP-parallel f32 kernels). See cpu_backend.cpp.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace trl {

struct ProgramStats {
  size_t arena_bytes = 0;       // the planned arena of one program
  double compile_seconds = 0;   // time to plan and lower it
};

struct CpuBackendOptions {
  // All programs of the backend plan into one arena, grown to the largest of them, instead of one arena each:
  // peak memory is the largest program's, however many shapes are cached. The price: a program's outputs (views
  // into the arena) are valid only until any program of this backend runs again, so callers must consume or
  // clone() them first (the Trainer does: it accumulates each micro-batch's gradients before the next runs).
  bool share_arena = false;
};

std::unique_ptr<Backend> make_cpu_backend();
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

}  // namespace trl

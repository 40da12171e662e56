// The CPU backend (oneDNN GEMM, planned arena, OpenMP-parallel f32 kernels): cpu_backend.cpp and docs/ARCHITECTURE.md.
#pragma once

#include <memory>

#include "trl/backend/backend.h"

namespace trl {

struct CpuBackendOptions {
  // All programs of the backend plan into one arena, grown to the largest of them, instead of one arena each:
  // peak memory is the largest program's, however many shapes are cached. The price: a program's outputs (views
  // into the arena) are valid only until any program of this backend runs again, so callers must consume or
  // clone() them first (the Trainer does: it accumulates each micro-batch's gradients before the next runs).
  bool share_arena = false;
  // OpenMP threads of the kernels and oneDNN (0: runtime's num_threads(), i.e. TRL_NUM_THREADS or the visible
  // cores). Set only while a program compiles or runs; the process's own setting is left as it was.
  int num_threads = 0;
  // Run graph::optimize (the fusion passes) before lowering; false: the graph as written, dead code aside.
  bool graph_passes = true;
};

std::unique_ptr<Backend> make_cpu_backend();
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

}  // namespace trl

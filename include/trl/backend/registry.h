// The backend registry: every part of trl.cpp that runs a graph gets its backend here, by name, so that a new
// backend (CUDA next) is one entry in registry.cpp and not a search through the callers (docs/ARCHITECTURE.md).
//
//   "cpu"        oneDNN GEMMs, planned arena, OpenMP kernels (src/backend/cpu/)
//   "reference"  the oracle: plain loops, f64 accumulation (src/backend/reference/); torch_compile=false,
//                disable_compile=True
//   "cuda"       not built yet: asking for it is an error that lists what this build has
//   "auto"       the best backend whose device is present, in the order above (never the reference)
//
// A backend that is not built, or whose device is not present, is an error naming the backends that are there:
// never a silent fallback to another device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trl/backend/backend.h"

namespace trl {

struct BackendOptions {
  // CPU: all programs of the backend plan into one arena grown to the largest (see CpuBackendOptions).
  bool share_arena = false;
  // CPU: OpenMP threads (0: TRL_NUM_THREADS, else the visible cores).
  int num_threads = 0;
  // Compiled backends: run graph::optimize's passes (fusion) before lowering. false lowers the graph as written
  // (dead code aside): to compare a fused program with the unfused one, and to test each op's own lowering.
  bool graph_passes = true;
};

struct BackendInfo {
  std::string name;
  std::string description;
  bool built = false;    // compiled into this binary
  bool present = false;  // its device is on this machine (always true for the host backends)
};

// Every backend name the registry knows, with whether this build has it and whether its device is present.
std::vector<BackendInfo> backend_registry();
// The names of the backends that can run here, best first.
std::vector<std::string> available_backends();
// "auto" resolved to a backend name, or `name` itself after checking it can run here (an error otherwise).
std::string resolve_backend(const std::string& name);
// A new backend by name ("auto" | "cpu" | "reference" | "cuda").
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options = {});

}  // namespace trl

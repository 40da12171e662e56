// The backend registry: every part of trl.cpp that runs a graph gets its backend here, by name, so that a new
// backend (CUDA next) is one entry in registry.cpp and not a search through the callers (docs/ARCHITECTURE.md).
//
//   "cpu"        oneDNN GEMMs, planned arena, OpenMP kernels (src/backend/cpu/)
//   "reference"  the oracle: plain loops, f64 accumulation (src/backend/reference/); torch_compile=false,
//                disable_compile=True
//   "reference-device"  the oracle on tensors the host may not read (tests of the device seam; not listed)
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

// What any caller may ask of any backend; each backend's factory maps it onto its own options (the CPU's:
// CpuBackendOptions, which also has its thread count).
struct BackendOptions {
  // All programs of the backend share one block of working memory, grown to the largest: peak memory is the largest
  // program's, and a program's outputs are valid only until any program of the backend runs again.
  bool share_arena = false;
  // Compiled backends: run graph::optimize's passes (fusion) before lowering. false lowers the graph as written
  // (dead code aside): to compare a fused program with the unfused one, and to test each op's own lowering.
  bool graph_passes = true;
};

struct BackendInfo {
  std::string name;
  std::string description;
  bool built = false;    // compiled into this binary
  bool present = false;  // its device is on this machine (always true for the host backends)
  bool device = false;   // a device of its own, for `device=`/`--device` (the reference backend is the host's oracle)
  bool listed = true;    // in `trl env` and in errors' lists; false for a backend made for tests by name only
};

// Every backend name the registry knows, with whether this build has it, whether its device is present and whether
// it is listed.
std::vector<BackendInfo> backend_registry();
// The names of the listed backends that can run here, best first.
std::vector<std::string> available_backends();
// "auto" resolved to a backend name, or `name` itself after checking it can run here (an error otherwise).
std::string resolve_backend(const std::string& name);
// A new backend by name ("auto" | "cpu" | "reference" | "cuda").
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options = {});

// Devices this build can run on here, best first ("cpu" is always one): the backends that are built, present and
// devices of their own.
std::vector<std::string> available_devices();
// Resolves "auto" to the best available device; rejects what is not one here, saying why (never a silent fallback).
std::string resolve_device(const std::string& requested);

}  // namespace trl

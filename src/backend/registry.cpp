#include "trl/backend/registry.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trl/backend/cpu/cpu_backend.h"
#include "trl/core/error.h"

namespace trl {

std::vector<BackendInfo> backend_registry() {
  return {
      {"cpu", "oneDNN GEMMs, a planned arena and OpenMP kernels on this machine's cores", true, true},
      {"reference", "the oracle: plain loops with f64 accumulation (slow; for tests and torch_compile=false)", true, true},
      {"cuda", "NVIDIA GPUs (not in this build: no CUDA backend has landed yet)", false, false},
  };
}

std::vector<std::string> available_backends() {
  std::vector<std::string> out;
  for (const BackendInfo& b : backend_registry())
    if (b.built && b.present) out.push_back(b.name);
  return out;
}

std::string resolve_backend(const std::string& name) {
  const std::vector<std::string> names = available_backends();
  if (name == "auto") {
    for (const std::string& n : names)
      if (n != "reference") return n;
  }
  for (const BackendInfo& b : backend_registry()) {
    if (b.name != name) continue;
    if (!b.built) fail("backend '{}' is not built into this binary (available: {}, or auto)", name, fmt::join(names, ", "));
    if (!b.present) fail("backend '{}' is built but its device is not present on this machine (available: {}, or auto)", name, fmt::join(names, ", "));
    return name;
  }
  fail("unknown backend '{}' (available: {}, or auto)", name, fmt::join(names, ", "));
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  const std::string resolved = resolve_backend(name);
  if (resolved == "cpu") return make_cpu_backend(CpuBackendOptions{.share_arena = options.share_arena, .num_threads = options.num_threads, .graph_passes = options.graph_passes});
  if (resolved == "reference") return make_reference_backend();
  fail("backend '{}' is registered but has no constructor", resolved);  // a registry entry without its make_ line
}

}  // namespace trl

#include "trl/backend/registry.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trl/backend/cpu/cpu_backend.h"
#include "trl/core/error.h"

namespace trl {

namespace {

// One entry per backend: a new backend is a line here (and its factory), never a search through the callers.
struct BackendEntry {
  const char* name;
  const char* description;
  bool built;                // compiled into this binary
  bool device;               // a device of its own (not the host's oracle)
  bool listed;               // named in `trl env` and in errors (false: a backend for tests, made by name only)
  bool (*present)();         // its device is on this machine now
  std::unique_ptr<Backend> (*make)(const BackendOptions&);
};

bool always() { return true; }
bool never() { return false; }

std::unique_ptr<Backend> make_cpu(const BackendOptions& o) {
  return make_cpu_backend(CpuBackendOptions{.share_arena = o.share_arena, .graph_passes = o.graph_passes});
}
// The oracle interprets graphs as written: it has no passes and no shared working memory to choose.
std::unique_ptr<Backend> make_reference(const BackendOptions&) { return make_reference_backend(); }
std::unique_ptr<Backend> make_reference_device(const BackendOptions&) { return make_reference_device_backend(); }

const std::vector<BackendEntry>& entries() {
  static const std::vector<BackendEntry> table = {
      {"cpu", "oneDNN GEMMs, a planned arena and OpenMP kernels on this machine's cores", true, true, true, always, make_cpu},
      {"reference", "the oracle: plain loops with f64 accumulation (slow; for tests and torch_compile=false)", true, false, true, always, make_reference},
      {"reference-device", "the oracle on tensors the host may not read: stands for a device backend in tests", true, true, false, always, make_reference_device},
      {"cuda", "NVIDIA GPUs (not in this build: no CUDA backend has landed yet)", false, true, true, never, nullptr},
  };
  return table;
}

}  // namespace

std::vector<BackendInfo> backend_registry() {
  std::vector<BackendInfo> out;
  for (const BackendEntry& e : entries()) out.push_back({e.name, e.description, e.built, e.built && e.present(), e.device, e.listed});
  return out;
}

std::vector<std::string> available_backends() {
  std::vector<std::string> out;
  for (const BackendInfo& b : backend_registry())
    if (b.built && b.present && b.listed) out.push_back(b.name);
  return out;
}

std::string resolve_backend(const std::string& name) {
  const std::vector<std::string> names = available_backends();
  if (name == "auto") return available_devices().front();  // the best device; never an oracle
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
  for (const BackendEntry& e : entries())
    if (e.name == resolved && e.make != nullptr) return e.make(options);
  fail("backend '{}' is registered but has no constructor", resolved);  // a built entry without its factory
}

std::vector<std::string> available_devices() {
  std::vector<std::string> out;
  for (const BackendInfo& b : backend_registry())
    if (b.built && b.present && b.device && b.listed) out.push_back(b.name);
  return out;
}

std::string resolve_device(const std::string& requested) {
  const std::vector<std::string> devices = available_devices();
  if (requested == "auto") return devices.front();
  for (const BackendInfo& b : backend_registry())  // an unlisted device (a test's) only when named
    if (b.name == requested && !b.listed && b.device && b.built && b.present) return requested;
  if (std::find(devices.begin(), devices.end(), requested) == devices.end()) {
    resolve_backend(requested);  // says why: unknown, not built, or not present
    fail("'{}' is not a device (devices: {}, or auto)", requested, fmt::join(devices, ", "));
  }
  return requested;
}

}  // namespace trl

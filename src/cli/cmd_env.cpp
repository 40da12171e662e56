// `trl env`: what this build is and what it sees (version, build options, ISA, devices, cores, threads, oneDNN).
#include <cstdio>

#include <dnnl.h>
#include <omp.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "cli/options.h"
#include "backend/cpu/kernel_report.h"
#include "core/cpu_features.h"
#include "core/memory.h"
#include "trl/backend/registry.h"
#include "trl/dist/communicator.h"
#include "trl/io/hub.h"
#include "trl/runtime/runtime.h"
#include "version.h"

namespace trl::cli {

namespace {

nlohmann::ordered_json env_info() {
  const CpuFeatures& f = cpu_features();
  const dnnl_version_t* dv = dnnl_version();
  nlohmann::ordered_json j;
  j["version"] = TRL_VERSION;
  j["build_type"] = TRL_BUILD_TYPE;
  j["compiler"] = TRL_COMPILER;
  j["sanitizers"] = TRL_SANITIZERS;
  j["isa"] = best_isa();
  j["cpu"] = f.brand;
  j["cpu_features"] = {{"avx2", f.avx2}, {"fma", f.fma}, {"avx512f", f.avx512f}, {"avx512bw", f.avx512bw},
                       {"avx512vl", f.avx512vl}, {"avx512bf16", f.avx512bf16}, {"amx_bf16", f.amx_bf16}};
  j["cpu_kernels"] = cpu_kernels_info();
  j["devices"] = available_devices();
  std::vector<std::string> backends;
  for (const BackendInfo& b : backend_registry())
    if (b.listed) backends.push_back(b.built && b.present ? b.name : b.name + (b.built ? " (device not present)" : " (not built)"));
  j["backends"] = backends;
  // The memory the default device's tensors and programs draw on (what the trainers' memory check plans against).
  const Backend::Memory m = make_backend("auto")->memory();
  j["device_memory"] = fmt::format("{} available of {} ({})", format_bytes(m.available), m.total ? format_bytes(m.total) : "unknown", m.source);
  const dist::Communicator& world = dist::world();
  j["communicator"] = world.kind();
  j["rank"] = world.rank();
  j["world_size"] = world.size();
  j["local_rank"] = world.local_rank();
  j["local_world_size"] = world.local_size();
  const auto cores = visible_cores();  // this rank's, under mpirun
  j["visible_cores"] = format_core_list(cores);
  j["num_visible_cores"] = cores.size();
  j["threads"] = num_threads();
  j["openmp_threads"] = omp_get_max_threads();  // what loops outside programs run on: must equal threads
  j["onednn"] = fmt::format("{}.{}.{}", dv->major, dv->minor, dv->patch);
  j["onednn_cpu_runtime"] = dv->cpu_runtime == DNNL_RUNTIME_OMP ? "omp" : dv->cpu_runtime == DNNL_RUNTIME_TBB ? "tbb"
                            : dv->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential" : "other";
  j["cache_dir"] = cache_dir();
  j["hf_hub_cache"] = hub_cache_dirs();
  return j;
}

}  // namespace

nlohmann::ordered_json cpu_kernels_info() {
  nlohmann::ordered_json kernels;
  for (const auto& [op, family] : cpu::kernel_families()) kernels[op] = family;
  return kernels;
}

void register_env(CLI::App& app) {
  auto* cmd = add_command(app, "env", "Print the version, build options, detected ISA, devices, cores, threads and oneDNN version");
  auto json_out = std::make_shared<bool>(false);
  Options opts(cmd);
  opts.add("json", *json_out, "Print one JSON object");
  on_run(cmd, [json_out] {
    const auto j = env_info();
    if (*json_out) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::string value;
      if (it.value().is_string()) value = it.value().get<std::string>();
      else if (it->is_object()) {
        for (auto f = it->begin(); f != it->end(); ++f)
          value += f->is_boolean() ? fmt::format("{}{}={}", value.empty() ? "" : " ", f.key(), f->get<bool>() ? "yes" : "no")
                                   : fmt::format("{}{}: {}", value.empty() ? "" : "; ", f.key(), f->get<std::string>());
      } else if (it->is_array()) {
        for (const auto& e : *it) value += (value.empty() ? "" : ", ") + e.get<std::string>();
      } else value = it.value().dump();
      std::printf("%-20s %s\n", (it.key() + ":").c_str(), value.c_str());
    }
  });
}

}  // namespace trl::cli

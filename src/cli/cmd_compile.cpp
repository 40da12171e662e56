// `trl compile`: builds, ahead of time, every program a training run will need — one per bucket length that
// pad_to_multiple_of and max_length allow — and keeps their plans in the on-disk program cache, as
// neuron_parallel_compile fills the Neuron cache before a run. One JSON line per program.
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include "trl/backend/registry.h"
#include "trl/backend/program_cache.h"
#include "cli/cli_util.h"
#include "cli/options.h"
#include "trl/core/error.h"
#include "trl/models/init.h"
#include "trl/runtime/runtime.h"
#include "trl/runtime/shapes.h"
#include "trl/train/objectives.h"

namespace trl::cli {

void register_compile(CLI::App& app) {
  auto* cmd = add_command(app, "compile", "Compile ahead of time every training program a run needs (one per bucket) into the program cache");
  struct Args {
    std::string model, preset, dtype = "bf16", pad_to_multiple_of = "auto", revision = "main";
    int64_t layers = 0, batch = 8, max_length = 1024;
    bool gradient_checkpointing = false;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("model_name_or_path", a->model, "A model folder or a Hugging Face id in the local cache");
  opts.add("preset", a->preset, "Instead of a model: " + fmt::format("{}", fmt::join(model_presets(), " | "))).choices(model_presets());
  opts.add("layers", a->layers, "With --preset: override the number of layers");
  opts.add("revision", a->revision, "Revision in the Hugging Face cache");
  opts.add("dtype", a->dtype, "Compute dtype: bf16 | f32").choices({"bf16", "f32"});
  opts.add("per_device_train_batch_size", a->batch, "Rows per training program").min(1);
  opts.add("max_length", a->max_length, "Longest sequence").min(1);
  opts.add("pad_to_multiple_of", a->pad_to_multiple_of, "None | auto | N: the bucket");
  opts.add("gradient_checkpointing", a->gradient_checkpointing, "Compile the rematerialising variant");
  on_run(cmd, [a] {
    if (a->model.empty() == a->preset.empty()) usage_fail("trl compile: give exactly one of --model_name_or_path and --preset");
    const DType dt = a->dtype == "bf16" ? DType::BF16 : DType::F32;
    auto backend = make_backend("auto");
    const int64_t multiple = parse_pad_to_multiple_of(a->pad_to_multiple_of, backend->auto_pad_multiple());
    // Only shapes matter: preset weights are allocated, never initialised or touched.
    std::optional<CausalLM> model;
    if (!a->preset.empty()) {
      ModelConfig cfg = preset_config(a->preset, dt);
      if (a->layers > 0) cfg.num_hidden_layers = cfg.max_window_layers = a->layers;
      TensorMap w;
      for (const auto& [name, shape] : parameter_shapes(cfg)) w[name] = Tensor::uninitialized(dt, shape);
      model.emplace(CausalLM::from_weights(cfg, std::move(w), a->preset));
    } else {
      LoadOptions lo;
      lo.dtype = dt;
      lo.revision = a->revision;
      model.emplace(CausalLM::from_pretrained(a->model, lo));
    }
    const std::string dir = default_program_cache_dir();
    if (dir.empty()) fail("trl compile: the disk cache is off (TRL_DISK_CACHE=0); nothing would be kept");
    ProgramCache cache(*backend, ProgramCacheOptions{1, dir});
    for (int64_t T : bucket_lengths(a->max_length, multiple)) {
      const int64_t hits_before = cache.stats().disk_hits;
      const auto t0 = std::chrono::steady_clock::now();
      const graph::Graph g = training_graph(*model, {.batch = a->batch, .tokens = T, .gradient_checkpointing = a->gradient_checkpointing});
      Program& p = cache.get(g);
      nlohmann::ordered_json j;
      j["program"] = "train";
      j["batch"] = a->batch;
      j["seq"] = T;
      j["nodes"] = g.nodes.size();
      j["arena_mb"] = static_cast<double>(p.arena_bytes()) / (1024.0 * 1024.0);
      j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      j["plan_from_disk"] = cache.stats().disk_hits > hits_before;
      j["plan"] = cache.plan_path(cache.key(g));
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  });
}

}  // namespace trl::cli

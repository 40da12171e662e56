// `trl bench dpo`: one DPO training step on Qwen3 shapes — the frozen reference's forward pass (or none, with
// --precompute_ref_log_probs), the policy's two-stage program, the sigmoid loss on the host, AdamW — beside which
// bench/dpo_torch.py runs the same step in PyTorch (bench/run_dpo.sh prints the ratio).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include "cli/cli_util.h"
#include "cli/options.h"
#include "core/clock.h"
#include "core/cpu_features.h"
#include "core/rng.h"
#include "train/dpo_step.h"
#include "train/optim/adamw.h"
#include "trl/backend/registry.h"
#include "trl/models/init.h"
#include "trl/runtime/runtime.h"

namespace trl::cli {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

void register_bench_dpo(CLI::App* bench) {
  auto* cmd = add_command(*bench, "dpo", "One DPO training step (reference forward, policy forward and backward, AdamW) on Qwen3 shapes");
  struct Args {
    std::string preset = "qwen3-0.6b", dtype = "bf16";
    int64_t layers = 0, pairs = 2, seq = 512, steps = 3;
    bool precompute = false;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("preset", a->preset, fmt::format("{}", fmt::join(model_presets(), " | "))).choices(model_presets());
  opts.add("layers", a->layers, "Override the number of layers (same widths), 0 = the preset's");
  opts.add("pairs", a->pairs, "Preference pairs per step (2 x pairs sequences)").min(1);
  opts.add("seq", a->seq, "Tokens per sequence: half prompt, half completion").min(4).max(1 << 20);
  opts.add("dtype", a->dtype, "bf16 (bf16 compute, f32 master weights) | f32").choices({"bf16", "f32"});
  opts.add("steps", a->steps, "Timed steps (after one warm-up step)").min(1);
  opts.add("precompute_ref_log_probs", a->precompute, "Compute the reference log-probs once before the steps and release the reference");
  on_run(cmd, [a] {
    const DType dt = a->dtype == "bf16" ? DType::BF16 : DType::F32;
    ModelConfig cfg = preset_config(a->preset, dt);
    if (a->layers > 0) cfg.num_hidden_layers = cfg.max_window_layers = a->layers;
    TensorMap master = init_weights(cfg, DType::F32, 0, 0.02, false);
    TensorMap compute;
    for (auto& [name, t] : master) compute[name] = dt == DType::F32 ? t : t.to(dt);  // f32: the masters are the compute weights
    const CausalLM policy = CausalLM::from_weights(cfg, compute, "bench");
    // The reference: a frozen copy in the compute dtype (no master, no gradients, no optimizer state).
    TensorMap frozen;
    for (auto& [name, t] : compute) frozen[name] = t.clone();
    auto reference = std::make_unique<CausalLM>(CausalLM::from_weights(cfg, frozen, "reference"));
    frozen.clear();
    auto policy_backend = make_backend("auto"), ref_backend = make_backend("auto");
    ProgramCache policy_programs(*policy_backend);
    auto ref_programs = std::make_unique<ProgramCache>(*ref_backend);
    // Random pairs: a shared prompt of seq/2 tokens, completions of seq/2.
    SplitMix64 rng(1);
    auto tokens = [&](int64_t n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = static_cast<int32_t>(rng.next() % 151643);
      return v;
    };
    const int64_t half = a->seq / 2;
    std::vector<PreferenceExample> ex;
    for (int64_t i = 0; i < a->pairs; ++i) ex.push_back({tokens(half), tokens(a->seq - half), tokens(a->seq - half), "pair", std::nullopt});
    std::vector<const PreferenceExample*> pairs;
    for (const auto& e : ex) pairs.push_back(&e);
    DpoStepOptions o;
    o.data.max_length = a->seq;
    std::vector<RefLogps> ref;
    double precompute_s = 0;
    if (a->precompute) {
      const auto t0 = Clock::now();
      ref = dpo_reference_logps(*reference, *ref_programs, pairs, o);
      precompute_s = seconds_since(t0);
      ref_programs.reset();
      reference.reset();  // released: the steps hold no reference weights
    }
    AdamW opt(AdamWConfig{0.9, 0.999, 1e-8, 0.01});
    double loss = 0;
    auto step = [&] {
      if (!a->precompute) ref = dpo_reference_logps(*reference, *ref_programs, pairs, o);
      DpoStepResult r = dpo_step(policy, compute, policy_programs, pairs, ref, o);
      loss = r.loss.loss;
      TensorMap grads;
      for (auto& [name, g] : r.grads) grads[name.substr(5)] = std::move(g);  // "grad.<parameter>"
      opt.step(master, grads, 1e-6, *policy_backend, dt == DType::F32 ? nullptr : &compute);
    };
    step();  // warm-up (compiles)
    double best = 1e9, total = 0;
    for (int64_t s = 0; s < a->steps; ++s) {
      const auto t0 = Clock::now();
      step();
      const double dtm = seconds_since(t0);
      best = std::min(best, dtm);
      total += dtm;
    }
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    nlohmann::ordered_json j;
    j["bench"] = "dpo";
    j["preset"] = a->preset;
    j["layers"] = cfg.num_hidden_layers;
    j["dtype"] = a->dtype;
    j["pairs"] = a->pairs;
    j["seq"] = a->seq;
    j["threads"] = num_threads();
    j["isa"] = best_isa();
    j["cpu_kernels"] = cpu_kernels_info();
    j["precompute_ref_log_probs"] = a->precompute;
    j["step_seconds_best"] = best;
    j["step_seconds_mean"] = total / static_cast<double>(a->steps);
    j["tokens_per_s"] = static_cast<double>(2 * a->pairs * a->seq) / best;
    j["precompute_seconds"] = precompute_s;
    j["peak_rss_mb"] = static_cast<double>(ru.ru_maxrss) / 1024.0;
    j["programs_compiled"] = policy_programs.stats().compilations;
    j["loss"] = loss;
    std::printf("%s\n", j.dump().c_str());
  });
}

}  // namespace trl::cli

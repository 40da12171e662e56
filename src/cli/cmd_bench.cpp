// `trl bench train`: one full training step (forward, loss, backward, AdamW) of a Qwen3-shaped model on the CPU
// backend, as one JSON line: tokens/s, model FLOP utilisation against the GEMM peak measured in the same run,
// peak RSS, compile seconds for the new shape, and the time of a program-cache hit.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <optional>

#include <vector>
#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include "backend/cpu/gemm.h"
#include "backend/cpu/vec.h"
#include "trl/backend/registry.h"
#include "trl/backend/program_cache.h"
#include "trl/generation/generate.h"
#include "cli/cli_util.h"
#include "core/cpu_features.h"
#include "cli/options.h"
#include "trl/core/error.h"
#include "core/rng.h"
#include "trl/models/init.h"
#include "trl/runtime/runtime.h"
#include "trl/train/objectives.h"
#include "train/optim/adamw.h"

namespace trl::cli {

void register_bench_dpo(CLI::App* bench);  // cmd_bench_dpo.cpp

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The best of several 2048^3 GEMMs in `dtype` (f32 accumulation) on the GEMM the backend runs for that dtype here
// (oneDNN's, or the packed GEMM where oneDNN has none: bf16 without AVX-512): the machine's GEMM peak, FLOP/s.
double gemm_peak(DType dtype) {
  const int64_t n = 2048;
  const cpu::Gemm gemm(n, n, n, dtype, n, 1, dtype, 1, n, DType::F32, false, false);
  std::vector<uint8_t> a(static_cast<size_t>(n * n) * dtype_size(dtype)), b(a.size()), c(static_cast<size_t>(n * n) * sizeof(float));
  double best = 1e9;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = Clock::now();
    gemm.run(a.data(), b.data(), c.data());
    if (r > 0) best = std::min(best, since(t0));
  }
  return 2.0 * n * n * n / best;
}

// Memory read bandwidth, bytes/s: the best of several passes summing a 1 GiB buffer on every thread, with the
// vector kernels' software prefetch (vec::sum), so the bound is what a streaming kernel here can reach.
double read_bandwidth() {
  const int64_t n = (int64_t{1} << 30) / static_cast<int64_t>(sizeof(float)), chunk = 16384;
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);
  double best = 1e9, sink = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int64_t c = 0; c < n / chunk; ++c) total += cpu::vec::sum(buf.data() + c * chunk, chunk);
    sink += total;
    best = std::min(best, since(t0));
  }
  if (sink < 0) std::printf("%f", sink);  // keep the reads
  return static_cast<double>(n * static_cast<int64_t>(sizeof(float))) / best;
}

void register_bench_generate(CLI::App* bench) {
  auto* cmd = add_command(*bench, "generate", "Prefill and decode speed of the static-cache generation engine");
  struct Args {
    std::string preset = "qwen3-0.6b", dtype = "bf16";
    int64_t layers = 0, batch = 8, prompt_len = 512, new_tokens = 64;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("preset", a->preset, fmt::format("{}", fmt::join(model_presets(), " | "))).choices(model_presets());
  opts.add("layers", a->layers, "Override the number of layers (same widths), 0 = the preset's");
  opts.add("dtype", a->dtype, "bf16 | f32").choices({"bf16", "f32"});
  opts.add("batch", a->batch, "The larger decode batch (batch 1 is always measured)").min(1);
  opts.add("prompt_len", a->prompt_len, "Prompt tokens for the prefill figure").min(1);
  opts.add("new_tokens", a->new_tokens, "Tokens decoded per measurement").min(2).max(100000);
  on_run(cmd, [a] {
    const DType dt = a->dtype == "bf16" ? DType::BF16 : DType::F32;
    ModelConfig cfg = preset_config(a->preset, dt);
    if (a->layers > 0) cfg.num_hidden_layers = cfg.max_window_layers = a->layers;
    const CausalLM model = CausalLM::from_weights(cfg, init_weights(cfg, dt, 0, 0.02, false), "bench");
    Generator gen(model);
    SplitMix64 rng(7);
    auto prompts = [&](int64_t B, int64_t P) {
      std::vector<std::vector<int32_t>> out(static_cast<size_t>(B));
      for (auto& p : out)
        for (int64_t t = 0; t < P; ++t) p.push_back(static_cast<int32_t>(rng.next() % 150000));
      return out;
    };
    GenerationConfig g;
    g.do_sample = false;
    g.eos_token_id = std::vector<int32_t>{};
    g.pad_to_multiple_of = 0;  // exact shapes: the figures are for the stated lengths
    // Seconds of one generate() call (programs already compiled by a first call of the same shape).
    auto timed = [&](const std::vector<std::vector<int32_t>>& p, int64_t n) {
      g.max_new_tokens = n;
      (void)gen.generate(p, g);
      const auto t0 = Clock::now();
      (void)gen.generate(p, g);
      return since(t0);
    };
    const auto long_prompt = prompts(1, a->prompt_len);
    const double prefill_s = timed(long_prompt, 1);
    // Decode: the difference between N and 1 new tokens on a short prompt isolates N - 1 decode steps.
    auto decode_rate = [&](int64_t B) {
      const auto p = prompts(B, 16);
      const double one = timed(p, 1), many = timed(p, a->new_tokens);
      return static_cast<double>(B * (a->new_tokens - 1)) / (many - one);
    };
    const double decode1 = decode_rate(1), decodeB = decode_rate(a->batch);
    // Bytes a batch-1 decode step must read: every weight once, except that the embedding lookup reads one row (a
    // tied embedding is read whole as the lm_head) and of a mixture of experts only the token's K of E experts.
    double weight_bytes = 0;
    const bool untied = model.weights().count("lm_head.weight") > 0;
    for (const auto& [name, t] : model.weights()) {
      const bool expert = name.ends_with(".mlp.experts.gate_up_proj") || name.ends_with(".mlp.experts.down_proj");
      const bool lookup_only = untied && name == "model.embed_tokens.weight";
      double share = 1.0;
      if (expert) share = static_cast<double>(cfg.moe.num_experts_per_tok) / static_cast<double>(cfg.moe.num_experts);
      if (lookup_only) share = 1.0 / static_cast<double>(t.shape()[0]);
      weight_bytes += static_cast<double>(t.nbytes()) * share;
    }
    const double bw = read_bandwidth();
    const double bound = bw / weight_bytes;
    nlohmann::ordered_json j;
    j["bench"] = "generate";
    j["preset"] = a->preset;
    j["layers"] = cfg.num_hidden_layers;
    j["dtype"] = a->dtype;
    j["threads"] = num_threads();
    j["isa"] = best_isa();
    j["cpu_kernels"] = cpu_kernels_info();
    j["prompt_len"] = a->prompt_len;
    j["prefill_tokens_per_s"] = static_cast<double>(a->prompt_len) / prefill_s;
    j["decode_tokens_per_s_batch1"] = decode1;
    j["decode_batch"] = a->batch;
    j["decode_tokens_per_s_batchN"] = decodeB;
    j["weight_mb_per_token"] = weight_bytes / 1e6;
    j["read_bandwidth_gb_s"] = bw / 1e9;
    j["bandwidth_bound_tokens_per_s"] = bound;
    j["batch1_fraction_of_bound"] = decode1 / bound;
    j["programs_compiled"] = gen.stats().compilations;
    j["cache_hits"] = gen.stats().hits;
    std::printf("%s\n", j.dump().c_str());
  });
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = add_command(app, "bench", "Benchmarks that print one JSON line of figures");
  require_subcommand(bench);
  register_bench_generate(bench);
  register_bench_dpo(bench);
  auto* cmd = add_command(*bench, "train", "One training step (forward, loss, backward, AdamW) of a Qwen3-shaped model");
  struct Args {
    std::string preset = "qwen3-0.6b", dtype = "bf16";
    int64_t layers = 0, batch = 1, seq = 512, steps = 3, lora_r = 0, vocab_size = 0;
    double lora_alpha = 32, gkd_beta = -1;
    bool gradient_checkpointing = false;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("preset", a->preset, fmt::format("{}", fmt::join(model_presets(), " | "))).choices(model_presets());
  opts.add("layers", a->layers, "Override the number of layers (same widths), 0 = the preset's");
  opts.add("batch", a->batch, "Sequences per step").min(1);
  opts.add("seq", a->seq, "Tokens per sequence").min(2).max(1 << 20);
  opts.add("dtype", a->dtype, "bf16 (bf16 compute, f32 master weights) | f32").choices({"bf16", "f32"});
  opts.add("steps", a->steps, "Timed steps (after one warm-up step)").min(1);
  opts.add("vocab_size", a->vocab_size, "A smaller vocabulary (the layers' step without the 151936-row head), 0 = the preset's").min(0);
  opts.add("gradient_checkpointing", a->gradient_checkpointing, "Recompute each layer in the backward pass (less memory)");
  opts.add("lora_r", a->lora_r, "Train a LoRA adapter of this rank on every linear layer (the base frozen); 0 = full fine-tuning").min(0);
  opts.add("lora_alpha", a->lora_alpha, "LoRA alpha (with --lora_r)").above(0);
  opts.add("gkd_beta", a->gkd_beta, "A GKD step instead (lmbda 0): a teacher of the same shapes, the generalized JSD with this beta over "
                                    "the second half of each sequence (the completion); < 0 = SFT")
      .max(1);
  on_run(cmd, [a] {
    const DType dt = a->dtype == "bf16" ? DType::BF16 : DType::F32;
    ModelConfig cfg = preset_config(a->preset, dt);
    if (a->layers > 0) cfg.num_hidden_layers = cfg.max_window_layers = a->layers;
    if (a->vocab_size > 0) cfg.vocab_size = a->vocab_size;
    const int64_t B = a->batch, T = a->seq;
    // Full fine-tuning: f32 masters of every weight, compute copies in the dtype (AdamW writes the bf16 copies from
    // the masters in its own pass). LoRA: the base weights only in the compute dtype, f32 masters of the adapter.
    TensorMap master, compute;
    CausalLM model;
    if (a->lora_r > 0) {
      compute = init_weights(cfg, dt, 0, 0.02, false);
      LoraConfig lc;
      lc.r = a->lora_r;
      lc.lora_alpha = a->lora_alpha;
      lc.target_modules = {"all-linear"};
      LoraAdapter adapter = init_lora(cfg, lc, 1);
      for (auto& [name, t] : adapter.weights) {
        if (name.ends_with(".lora_B.weight")) t = Tensor::from_f32(std::vector<float>(static_cast<size_t>(t.numel()), 1e-3f), t.shape());
        master[name] = t;
        compute[name] = dt == DType::F32 ? t : t.to(dt);
      }
      model = CausalLM::from_weights(cfg, compute, "bench").with_adapter(adapter);
    } else {
      master = init_weights(cfg, DType::F32, 0, 0.02, false);
      for (auto& [name, t] : master) compute[name] = dt == DType::F32 ? t : t.to(dt);
      model = CausalLM::from_weights(cfg, compute, "bench");
    }
    auto backend = make_backend("auto");
    ProgramCache cache(*backend);
    // GKD: the teacher's forward-only program on its own backend, the student's distillation program.
    const bool gkd = a->gkd_beta >= 0;
    const int64_t K = T / 2;  // completion positions
    std::optional<CausalLM> teacher;
    auto tbackend = make_backend("auto");
    ProgramCache tcache(*tbackend);
    if (gkd) teacher = CausalLM::from_weights(cfg, init_weights(cfg, dt, 7, 0.02, false), "teacher");
    auto trace = [&] {
      return gkd ? distillation_graph(model, {.batch = B, .tokens = T, .logits_to_keep = K, .teacher = {cfg.hidden_size, dt}, .beta = a->gkd_beta, .gradient_checkpointing = a->gradient_checkpointing})
                 : training_graph(model, {.batch = B, .tokens = T, .gradient_checkpointing = a->gradient_checkpointing,
                                          .aux_loss = cfg.moe.num_experts > 0});  // a mixture of experts: + 0.001 · aux, as TRL's SFT
    };
    auto t0 = Clock::now();
    const graph::Graph g = trace();
    const double trace_s = since(t0);
    t0 = Clock::now();
    Program* program = &cache.get(g);
    const double compile_s = since(t0);
    const graph::Graph again = trace();  // traced anew, as a trainer would for its next batch
    t0 = Clock::now();
    program = &cache.get(again);
    const double hit_s = since(t0);
    // Random tokens, next-token labels, SFT weights.
    SplitMix64 rng(1);
    Tensor ids = Tensor::zeros(DType::I32, {B, T}), mask = Tensor::zeros(DType::I32, {B, T}), labels = Tensor::zeros(DType::I32, {B, T});
    Tensor w = Tensor::zeros(DType::F32, {B, T});
    const auto vocab = static_cast<uint64_t>(std::min<int64_t>(cfg.vocab_size, 151643));
    for (int64_t i = 0; i < B * T; ++i) ids.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % vocab);
    for (int64_t i = 0; i < B * T; ++i) {
      mask.mutable_data_as<int32_t>()[i] = 1;
      if (i % T != T - 1) {
        labels.mutable_data_as<int32_t>()[i] = ids.data_as<int32_t>()[i + 1];
        w.mutable_data_as<float>()[i] = -1.0f / static_cast<float>(B * (T - 1));
      }
    }
    const std::vector<std::string> trained = model.trainable_parameters();
    AdamW opt(AdamWConfig{0.9, 0.999, 1e-8, 0.01});
    double loss = 0;
    Tensor kept = Tensor::zeros(DType::I32, {B, K}), kw = Tensor::zeros(DType::F32, {B, K});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < K; ++k) {
        kept.mutable_data_as<int32_t>()[b * K + k] = static_cast<int32_t>(b * T + T - 1 - K + k);
        kw.mutable_data_as<float>()[b * K + k] = 1.0f / static_cast<float>(B * K);
      }
    auto step = [&] {
      TensorMap in = compute;
      in["input_ids"] = ids, in["attention_mask"] = mask, in["position_ids"] = default_position_ids(mask), in["labels"] = labels, in["loss_weights"] = w;
      if (cfg.moe.num_experts > 0 && !gkd) in["aux_loss_weight"] = Tensor::from_f32(std::vector<float>{static_cast<float>(cfg.moe.router_aux_loss_coef)}, {});
      if (gkd) {
        TensorMap tin = teacher->weights();
        tin["input_ids"] = ids, tin["attention_mask"] = mask, tin["position_ids"] = in["position_ids"], tin["kept_positions"] = kept;
        in["teacher_hidden"] = tcache.get(hidden_graph(*teacher, B, T, 1.0, K)).run(tin).at(0).clone();
        in["teacher_lm_head"] = teacher->weights().at(teacher->lm_head_name());
        in["kept_positions"] = kept, in["loss_weights"] = kw;
      }
      auto out = program->run(in);
      loss = out[0].data_as<float>()[0];
      TensorMap grads;
      for (size_t k = 0; k < trained.size(); ++k) grads[trained[k]] = std::move(out[k + 1]);
      opt.step(master, grads, 1e-5, *backend, dt == DType::F32 ? nullptr : &compute);
    };
    step();  // warm-up
    double best = 1e9, total = 0;
    for (int64_t s = 0; s < a->steps; ++s) {
      t0 = Clock::now();
      step();
      const double dtm = since(t0);
      best = std::min(best, dtm);
      total += dtm;
    }
    // Model FLOPs (what the step must do, recomputation excluded): 3x the forward's matmuls, lm_head and attention.
    const double C = static_cast<double>(cfg.hidden_size), F = static_cast<double>(cfg.intermediate_size), L = static_cast<double>(cfg.num_hidden_layers);
    const double q = static_cast<double>(cfg.q_dim()), kv = static_cast<double>(cfg.kv_dim()), V = static_cast<double>(cfg.vocab_size);
    const double tokens = static_cast<double>(B * T);
    // The MLPs' weights a token multiplies: a dense layer's 3·C·F; a sparse layer's router and its K experts.
    double mlp = 0;
    for (int64_t i = 0; i < cfg.num_hidden_layers; ++i)
      mlp += cfg.sparse_layer(i) ? C * static_cast<double>(cfg.moe.num_experts) +
                                       3 * C * static_cast<double>(cfg.moe.moe_intermediate_size * cfg.moe.num_experts_per_tok)
                                 : 3 * C * F;
    const double fwd = tokens * 2 * (L * (C * q + 2 * C * kv + q * C) + mlp + V * C) +
                       L * static_cast<double>(B) * static_cast<double>(cfg.num_attention_heads) * static_cast<double>(T) * static_cast<double>(T) *
                           static_cast<double>(cfg.head_dim) * 2;
    // LoRA: no weight gradients of the base or the frozen head (2x their forward GEMMs instead of 3x), plus the
    // adapters' GEMMs (forward, dx and dA/dB: 3 × 2 · tokens · r · (in + out) per module; stacked experts: their
    // ΔW = B_e·A_e and its two backward products, 3 × 2 · E · out · r · in).
    double lora_flops = 0;
    for (const std::string& m : model.lora_modules()) {
      const LoraShapes s = lora_shapes(cfg, m, a->lora_r);
      const double r = static_cast<double>(a->lora_r), in = static_cast<double>(s.a[1]), out = static_cast<double>(s.b[s.b.size() - 2]);
      lora_flops += s.experts > 0 ? 3 * 2 * static_cast<double>(s.experts) * out * r * in : 3 * 2 * tokens * r * (in + out);
    }
    const double base_weights = tokens * 2 * (L * (C * q + 2 * C * kv + q * C) + mlp);
    double flops = a->lora_r > 0 ? 3 * fwd - base_weights - tokens * 2 * V * C + lora_flops : 3 * fwd;
    // GKD: the student's step with its head on the K completion positions only, plus the teacher's forward (its
    // head on those positions too): what the step must compute, as PyTorch's TRL computes it over all positions.
    if (gkd) flops = 3 * (fwd - tokens * 2 * V * C) + 3 * 2 * static_cast<double>(B * K) * V * C + (fwd - tokens * 2 * V * C) + 2 * static_cast<double>(B * K) * V * C;
    const double peak = gemm_peak(dt);
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    nlohmann::ordered_json j;
    j["bench"] = "train";
    j["preset"] = a->preset;
    j["layers"] = cfg.num_hidden_layers;
    j["vocab_size"] = cfg.vocab_size;
    j["dtype"] = a->dtype;
    j["batch"] = B;
    j["seq"] = T;
    j["threads"] = num_threads();
    j["isa"] = best_isa();
    j["cpu_kernels"] = cpu_kernels_info();
    j["gradient_checkpointing"] = a->gradient_checkpointing;
    j["lora_r"] = a->lora_r;
    if (gkd) j["gkd_beta"] = a->gkd_beta, j["completion_tokens"] = B * K;
    j["trained_parameters"] = [&] {
      int64_t n = 0;
      for (const std::string& t : trained) n += model.weights().at(t).numel();
      return n;
    }();
    j["parameters"] = model.num_parameters();
    j["step_seconds_best"] = best;
    j["step_seconds_mean"] = total / static_cast<double>(a->steps);
    j["tokens_per_s"] = tokens / best;
    j["model_tflop_per_step"] = flops / 1e12;
    j["gemm_peak_gflops"] = peak / 1e9;
    j["mfu"] = flops / best / peak;
    j["peak_rss_mb"] = static_cast<double>(ru.ru_maxrss) / 1024.0;
    j["arena_mb"] = static_cast<double>(program->arena_bytes()) / (1024.0 * 1024.0);
    j["trace_seconds"] = trace_s;
    j["compile_seconds"] = compile_s;
    j["cache_hit_ms"] = hit_s * 1e3;
    j["programs_compiled"] = cache.stats().compilations;
    j["cache_hits"] = cache.stats().hits;
    j["loss"] = loss;
    std::printf("%s\n", j.dump().c_str());
  });
}

}  // namespace trl::cli

// TRL's GRPOTrainer and RLOOTrainer (docs/TRAINING.md, "trl grpo" and "trl rloo"): online RL on prompts. Each
// generation round samples num_generations completions per prompt from the *current* policy with the static-cache
// generator (its programs read the trainer's compute weights in place: no copy, no recompilation when they change),
// scores them with the reward functions, turns the rewards into group-relative advantages and trains on the
// clipped surrogate loss. Runs on the shared Trainer loop (see sft_trainer.h for what it saves and when).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/data/dataset.h"
#include "trl/models/causal_lm.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/base_trainer.h"
#include "trl/train/rewards.h"
#include "trl/train/training_args.h"

namespace trl {

// What GRPOConfig and RLOOConfig share (generation, batching, clipping), with GRPO's defaults.
struct OnlineRLConfig : TrainingArguments {
  OnlineRLConfig() { learning_rate = 1e-6; }
  int64_t num_generations = 8;  // completions per prompt (a group), >= 2
  int64_t max_completion_length = 512;
  // Completions per generation round (per_device_train_batch_size × steps_per_generation), a multiple of
  // num_generations; set at most one of the two. Default steps_per_generation: gradient_accumulation_steps.
  std::optional<int64_t> generation_batch_size;
  std::optional<int64_t> steps_per_generation;
  int64_t num_iterations = 1;  // optimizer passes over each generated batch (μ)
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;  // 0: off
  std::optional<double> min_p;
  double repetition_penalty = 1.0;
  // A mixture-of-experts policy: + router_aux_loss_coef · its load-balancing loss over each micro-batch's
  // prompt + completion rows, divided by the micro-batches of a step (TRL's GRPO and RLOO); 0: off; no effect on
  // a dense model.
  double router_aux_loss_coef = 0.001;
  double epsilon = 0.2;
  std::optional<double> epsilon_high;  // default: epsilon
  double beta = 0.0;                   // > 0: a frozen reference model and a KL term
  std::vector<double> reward_weights;  // one per reward function; empty: 1 each
  bool mask_truncated_completions = false;
  bool shuffle_dataset = true;
  // "static" (the only cache here; "dynamic" is accepted and also runs the static cache); None = static.
  std::string cache_implementation;
  std::string pad_to_multiple_of = "auto";  // "None" | "auto" (the backend's bucket) | an integer: prompt and completion buckets
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();  // e.g. {"enable_thinking": false}
  // TRL's generation_kwargs: generation settings over the ones above, for generation only (the loss keeps
  // `temperature`): do_sample, temperature, top_p, top_k, min_p, repetition_penalty. {"do_sample": false} is greedy.
  nlohmann::ordered_json generation_kwargs = nlohmann::ordered_json::object();
  bool log_completions = false;
  std::optional<int64_t> num_completions_to_print;  // with log_completions: rows shown per logging step (default 4)
  double reward_timeout_seconds = 120;  // exec:COMMAND rewards: the longest wait for one batch's answer
};

struct GRPOConfig : OnlineRLConfig {
  std::optional<double> delta;  // two-sided clipping: the unclipped ratio is capped at delta
  std::string loss_type = "dapo";  // grpo | bnpo | dr_grpo | dapo
  std::string scale_rewards = "group";  // group | batch | none
  std::string importance_sampling_level = "token";  // token | sequence
  std::string multi_objective_aggregation = "sum_then_normalize";  // | normalize_then_sum
};

struct RLOOConfig : OnlineRLConfig {
  RLOOConfig() { num_generations = 2, beta = 0.05; }
  bool normalize_advantages = false;
  std::optional<std::pair<double, double>> reward_clip_range;
};

// check_training_arguments plus every GRPO/RLOO option (num_generations >= 2, the batch layout's divisibility,
// ranges of the sampling and clipping options, known names). Throws trl::Error "GRPOConfig: <option> ...".
void check_grpo_config(const GRPOConfig& config, int64_t reward_functions);
void check_rloo_config(const RLOOConfig& config, int64_t reward_functions);

// One generated round, for tests and tools: what the trainer generated, the rewards and the advantages.
struct RolloutRecord {
  std::vector<std::string> prompts, completions;
  std::vector<std::vector<double>> rewards;  // [completion][function], NaN for None
  std::vector<double> advantages;
};

class GRPOTrainer : public BaseTrainer {
 public:
  // `train` holds a "prompt" column (text, or a conversation rendered with the chat template and
  // add_generation_prompt); every other column is passed to the reward functions. `ref_model`: the frozen
  // reference when beta > 0 (nullptr: a copy of `model`).
  GRPOTrainer(const CausalLM& model, const Tokenizer& tokenizer, std::vector<NamedRewardFunction> reward_funcs, Dataset train,
              GRPOConfig config, const CausalLM* ref_model = nullptr);
  ~GRPOTrainer() override;
  // Called after each generation round with what it produced (tests, demos); under data parallel, on every rank
  // with the whole round.
  std::function<void(const RolloutRecord&)> on_rollout;
  // The generator's program counters (prefill and decode programs compiled and reused).
  const ProgramCacheStats& generation_program_stats() const { return *generation_stats_; }

 private:
  const ProgramCacheStats* generation_stats_ = nullptr;
};

class RLOOTrainer : public BaseTrainer {
 public:
  RLOOTrainer(const CausalLM& model, const Tokenizer& tokenizer, std::vector<NamedRewardFunction> reward_funcs, Dataset train,
              RLOOConfig config, const CausalLM* ref_model = nullptr);
  ~RLOOTrainer() override;
  // Called after each generation round with what it produced (tests, demos); under data parallel, on every rank
  // with the whole round.
  std::function<void(const RolloutRecord&)> on_rollout;
  // The generator's program counters (prefill and decode programs compiled and reused).
  const ProgramCacheStats& generation_program_stats() const { return *generation_stats_; }

 private:
  const ProgramCacheStats* generation_stats_ = nullptr;
};

}  // namespace trl

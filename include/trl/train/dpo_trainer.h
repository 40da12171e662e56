// TRL's DPOTrainer (docs/TRAINING.md, "trl dpo"): preference pairs in every TRL format, a frozen reference model
// beside the policy (a copy of the starting weights, another checkpoint, or log-probs computed once before training
// with precompute_ref_log_probs), every loss_type of TRL with loss_weights, and TRL's metrics (rewards/*, logps/*,
// entropy, mean_token_accuracy). Runs on the shared Trainer loop (see sft_trainer.h for what it saves and when).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/backend/program_cache.h"
#include "trl/data/dataset.h"
#include "trl/models/causal_lm.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/base_trainer.h"
#include "trl/train/training_args.h"

namespace trl {

// TRL's DPOConfig: the Trainer's options (learning rate 1e-6) and DPO's own, with TRL's names and defaults.
struct DPOConfig : TrainingArguments {
  DPOConfig() { learning_rate = 1e-6; }
  int64_t max_length = 1024;                 // prompt + completion, per sequence
  std::string truncation_mode = "keep_start";  // keep_start | keep_end
  bool padding_free = false;
  std::string pad_to_multiple_of = "auto";  // "None" | "auto" (the backend's bucket) | an integer
  bool precompute_ref_log_probs = false;
  std::optional<int64_t> precompute_ref_batch_size;  // default: per_device_train_batch_size
  std::vector<std::string> loss_type = {"sigmoid"};
  std::vector<double> loss_weights;  // one per loss_type; empty: 1 each
  double beta = 0.1;
  double label_smoothing = 0.0;
  std::string f_divergence_type = "reverse_kl";  // reverse_kl | forward_kl | js_divergence | alpha_divergence
  double f_alpha_divergence_coef = 0.5;
  double discopop_tau = 0.05;
  // A mixture-of-experts policy: + router_aux_loss_coef · its load-balancing loss over the pairs' 2N sequences
  // (TRL's DPOTrainer); 0: off; no effect on a dense model.
  double router_aux_loss_coef = 0.001;
  // LD-DPO (in [0, 1]): completion tokens past the pair's shorter completion count ld_alpha times in the sequence
  // log-probs of policy and reference; None: every token once (standard DPO).
  std::optional<double> ld_alpha;
  // TR-DPO: every ref_model_sync_steps optimizer steps the reference becomes α·policy + (1 − α)·reference
  // (α = ref_model_mixup_alpha). Not with precompute_ref_log_probs.
  bool sync_ref_model = false;
  double ref_model_mixup_alpha = 0.6;
  int64_t ref_model_sync_steps = 512;
  std::string eos_token;  // appended to text completions; "" = the tokenizer's
};

// check_training_arguments(config, "DPOConfig"), the loss options (known loss and divergence types, loss_weights
// matching loss_type, beta > 0, label_smoothing in range for the loss), max_length >= 2, truncation_mode, ld_alpha in
// [0, 1] (not with loss_type sft), sync_ref_model's options (not with precompute_ref_log_probs).
void check_dpo_config(const DPOConfig& config);

class DPOTrainer : public BaseTrainer {
 public:
  // `model` is the policy's architecture and starting weights; `ref_model` the frozen reference (nullptr: a copy
  // of `model` in the compute dtype, as TRL makes when no ref_model is given). evaluate_metrics() gives eval_loss,
  // eval_rewards/... and eval_logps/....
  DPOTrainer(const CausalLM& model, const Tokenizer& tokenizer, Dataset train, DPOConfig config, std::optional<Dataset> eval = std::nullopt,
             const CausalLM* ref_model = nullptr);
  ~DPOTrainer() override;
};

}  // namespace trl

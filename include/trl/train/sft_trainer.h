// TRL's SFTTrainer (docs/TRAINING.md): SFT data under the padding policy (padded, padding-free or packed rows),
// token-level loss normalisation over the whole accumulated batch, on the shared Trainer loop (seeded shuffling,
// clipping, AdamW, schedules, evaluation, logging, checkpoints with exact resume, Ctrl-C saving a checkpoint).
// Option names and defaults are TRL's (SFTConfig over TrainingArguments).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/backend/program_cache.h"
#include "trl/data/dataset.h"
#include "trl/data/sft.h"
#include "trl/models/causal_lm.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/base_trainer.h"
#include "trl/train/training_args.h"

namespace trl {

// TRL's SFTConfig: the Trainer's options (TrainingArguments, with SFT's learning rate 2e-5) and SFT's own.
struct SFTConfig : TrainingArguments {
  SFTConfig() { learning_rate = 2e-5; }
  int64_t max_length = 1024;
  bool packing = false;
  bool padding_free = false;
  std::optional<bool> completion_only_loss;
  bool assistant_only_loss = false;
  std::string pad_to_multiple_of = "auto";  // "None" | "auto" (the backend's bucket: 64 on the CPU) | an integer
  std::string dataset_text_field = "text";
  std::string eos_token;
  // A mixture-of-experts model's load-balancing loss joins the loss with this weight (divided by the gradient
  // accumulation steps, as TRL does); 0: off; no effect on a dense model (TRL's default and rule).
  double router_aux_loss_coef = 0.001;
};

// check_training_arguments(config, "SFTConfig"), then SFT's options: max_length >= 2, and with a tokenizer that a
// given eos_token is one token of it. Throws trl::Error "SFTConfig: <option> must be ..., got <value>". The
// SFTTrainer constructor calls it.
void check_sft_config(const SFTConfig& config, const Tokenizer* tokenizer = nullptr);

class SFTTrainer : public BaseTrainer {
 public:
  // `model` supplies the architecture and the starting weights (trained in f32 masters; computed in bf16 when
  // config.bf16). evaluate_metrics() gives eval_loss, eval_entropy and eval_mean_token_accuracy.
  SFTTrainer(const CausalLM& model, const Tokenizer& tokenizer, Dataset train, SFTConfig config, std::optional<Dataset> eval = std::nullopt);
  ~SFTTrainer() override;
  // The mean token loss over the eval dataset with the current weights.
  double evaluate();
};

}  // namespace trl

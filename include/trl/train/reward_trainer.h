// TRL's RewardTrainer (docs/TRAINING.md, "trl reward"): a sequence-classification reward model trained on
// preference pairs with the Bradley–Terry loss (the optional `margin` column, center_rewards_coefficient); pairs
// longer than max_length are dropped, as TRL filters them; metrics accuracy, margin and min/mean/max reward. The
// saved folder is a Qwen3ForSequenceClassification checkpoint. Runs on the shared Trainer loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "trl/backend/program_cache.h"
#include "trl/data/dataset.h"
#include "trl/models/reward_model.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/base_trainer.h"
#include "trl/train/training_args.h"

namespace trl {

// TRL's RewardConfig: the Trainer's options (learning rate 1e-4) and the reward model's own.
struct RewardConfig : TrainingArguments {
  RewardConfig() { learning_rate = 1e-4; }
  int64_t max_length = 1024;                // pairs whose chosen or rejected sequence is longer are dropped
  std::string pad_to_multiple_of = "auto";  // "None" | "auto" (the backend's bucket) | an integer
  std::optional<double> center_rewards_coefficient;
  std::string eos_token;  // appended to text completions; "" = the tokenizer's
};

void check_reward_config(const RewardConfig& config);

class RewardTrainer : public BaseTrainer {
 public:
  // `model`: the decoder and its score head (load_reward_model: a new head on a causal LM, or a saved reward model).
  // evaluate_metrics() gives eval_loss, eval_accuracy, eval_margin and eval_min|mean|max_reward; master_weights()
  // holds the decoder's trained weights and score.weight.
  RewardTrainer(const RewardModel& model, const Tokenizer& tokenizer, Dataset train, RewardConfig config, std::optional<Dataset> eval = std::nullopt);
  ~RewardTrainer() override;
};

}  // namespace trl

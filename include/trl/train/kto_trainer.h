// TRL's KTOTrainer (docs/TRAINING.md, "trl kto"): unpaired preference data (prompt, completion, boolean label; a
// paired dataset is unpaired as TRL does), a frozen reference beside the policy (or reference log-probs
// precomputed once), the KL estimate from mismatched pairs (each row's prompt with the previous row's completion
// within its batch; detached, clamped at 0), desirable/undesirable weights with TRL's warning on their balance, and
// loss_type kto or apo_zero_unpaired. Runs on the shared Trainer loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "trl/backend/program_cache.h"
#include "trl/data/dataset.h"
#include "trl/models/causal_lm.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/base_trainer.h"
#include "trl/train/training_args.h"

namespace trl {

// TRL's KTOConfig: the Trainer's options (learning rate 1e-6, train_sampling_strategy sequential) and KTO's own.
struct KTOConfig : TrainingArguments {
  KTOConfig() {
    learning_rate = 1e-6;
    train_sampling_strategy = "sequential";
  }
  int64_t max_length = 1024;                 // prompt + completion, per sequence (the start is kept)
  std::string pad_to_multiple_of = "auto";  // "None" | "auto" (the backend's bucket) | an integer
  bool precompute_ref_log_probs = false;
  std::optional<int64_t> precompute_ref_batch_size;  // default: per_device_train_batch_size
  std::string loss_type = "kto";                     // kto | apo_zero_unpaired
  double beta = 0.1;
  double desirable_weight = 1.0;
  double undesirable_weight = 1.0;
  // A mixture-of-experts policy: + router_aux_loss_coef · its load-balancing loss over the batch (TRL's
  // KTOTrainer; the KL rows are not in it); 0: off; no effect on a dense model.
  double router_aux_loss_coef = 0.001;
  std::string eos_token;  // appended to text completions; "" = the tokenizer's
};

// check_training_arguments(config, "KTOConfig"), the loss options, max_length >= 2, and TRL's two rules for the KL
// estimate (loss_type kto): per_device_train_batch_size > 1 (with one row the mismatched pair is the row itself, so
// the KL term would equal the implied reward) and train_sampling_strategy sequential (the mismatched pairs are
// formed within the dataset's fixed batches).
void check_kto_config(const KTOConfig& config);

class KTOTrainer : public BaseTrainer {
 public:
  // `ref_model`: the frozen reference (nullptr: a copy of `model` in the compute dtype). evaluate_metrics() gives
  // eval_loss, eval_kl and eval_rewards/..., eval_logps/....
  KTOTrainer(const CausalLM& model, const Tokenizer& tokenizer, Dataset train, KTOConfig config, std::optional<Dataset> eval = std::nullopt,
             const CausalLM* ref_model = nullptr);
  ~KTOTrainer() override;
};

}  // namespace trl

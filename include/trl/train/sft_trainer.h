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
};

// check_training_arguments(config, "SFTConfig"), then SFT's options: max_length >= 2, and with a tokenizer that a
// given eos_token is one token of it. Throws trl::Error "SFTConfig: <option> must be ..., got <value>". The
// SFTTrainer constructor calls it.
void check_sft_config(const SFTConfig& config, const Tokenizer* tokenizer = nullptr);

class Trainer;

class SFTTrainer {
 public:
  // `model` supplies the architecture and the starting weights (trained in f32 masters; computed in bf16 when
  // config.bf16). `model_dir` (optional) is where tokenizer and generation files are copied from into checkpoints.
  SFTTrainer(const CausalLM& model, const Tokenizer& tokenizer, Dataset train, SFTConfig config, std::optional<Dataset> eval = std::nullopt);
  ~SFTTrainer();
  // Trains to max_steps (else num_train_epochs). Every save_steps (the last step included when it is a multiple)
  // it saves output_dir/checkpoint-N, written into checkpoint-N.tmp and renamed; at the end the final model,
  // trainer_state.json and training_report.html go into output_dir all or nothing (as save_model). A failed save
  // removes its partial folder and throws; checkpoints already saved stay. output_dir/log.jsonl always equals
  // log_history: a fresh run starts it anew, a resume from checkpoint-N rewrites it with that checkpoint's entries.
  TrainOutput train();
  // The mean token loss over the eval dataset with the current weights.
  double evaluate();
  // eval_loss, eval_entropy and eval_mean_token_accuracy over the eval dataset (as logged at eval time).
  nlohmann::ordered_json evaluate_metrics();
  // Writes the model (in the dtype it was loaded with), its config, generation config and tokenizer to `dir`, all
  // or nothing: the files are written into `dir`/.final.tmp and renamed into `dir` only once every one of them was
  // written; on an error (a full disk) the temp folder is removed, `dir`'s files are left as they were, and the
  // trl::Error says what failed.
  void save_model(const std::string& dir) const;
  const TensorMap& master_weights() const;
  const ProgramCacheStats& program_stats() const;
  // Called after every optimizer step with the log entry of that step (tests, progress displays).
  std::function<void(const nlohmann::ordered_json&)> on_step;

 private:
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace trl

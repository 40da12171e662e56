// The Trainer loop and SFT (docs/TRAINING.md): seeded shuffling, collation under the padding policy, gradient
// accumulation with token-level normalisation over the whole accumulated batch, global-norm clipping, AdamW (no
// decay on norms and biases), schedules, evaluation, logging, checkpoints with exact resume, and Ctrl-C saving a
// checkpoint. Option names and defaults are TRL's (SFTConfig over TrainingArguments).
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

namespace trl {

struct SFTConfig {
  // TrainingArguments (TRL's overrides applied: logging_steps 10, bf16 true, SFT learning rate 2e-5).
  std::string output_dir = "trainer_output";
  double learning_rate = 2e-5;
  int64_t per_device_train_batch_size = 8;
  int64_t per_device_eval_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double num_train_epochs = 3;
  int64_t max_steps = -1;
  std::string lr_scheduler_type = "linear";  // linear | cosine | constant | constant_with_warmup
  double warmup_ratio = 0;
  int64_t warmup_steps = 0;
  double weight_decay = 0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  int64_t logging_steps = 10;
  int64_t save_steps = 500;
  std::optional<int64_t> save_total_limit;
  std::string eval_strategy = "no";  // no | steps | epoch
  std::optional<int64_t> eval_steps;  // default: logging_steps
  uint64_t seed = 42;
  bool bf16 = true;
  bool torch_compile = true;  // the compiled CPU backend; false: the reference backend (the oracle; slow)
  bool gradient_checkpointing = false;
  bool dataloader_drop_last = false;
  std::string resume_from_checkpoint;  // a checkpoint folder, or "last" / "true" for the newest in output_dir
  // SFT.
  int64_t max_length = 1024;
  bool packing = false;
  bool padding_free = false;
  std::optional<bool> completion_only_loss;
  bool assistant_only_loss = false;
  std::string pad_to_multiple_of = "auto";  // "None" | "auto" (the backend's bucket: 64 on the CPU) | an integer
  std::string dataset_text_field = "text";
  std::string eos_token;
  bool report = true;        // write training_report.html in output_dir
  bool progress = true;      // progress bar on a terminal, plain lines otherwise
  // Names shown in the report's run summary (TRL's ModelConfig.model_name_or_path and ScriptArguments.dataset_name;
  // the trainer itself never loads by them). Default: the model's folder and the training rows' file.
  std::string model_name_or_path;
  std::string dataset_name;
};

// Checks every option as TrainingArguments and torch.optim.AdamW do: finite numbers in range (learning_rate >= 0,
// adam_beta1/2 in [0, 1), adam_epsilon > 0, weight_decay >= 0, max_grad_norm >= 0, warmup_ratio in [0, 1],
// num_train_epochs > 0), whole-number options >= 1, known names, seed in numpy's [0, 2^32 - 1]; with a tokenizer
// also that a given eos_token is one token of it. Throws trl::Error "SFTConfig: <option> must be ..., got <value>".
// The SFTTrainer constructor calls it.
void check_sft_config(const SFTConfig& config, const Tokenizer* tokenizer = nullptr);

struct TrainOutput {
  int64_t global_step = 0;
  double training_loss = 0;  // mean of the logged step losses
  std::vector<nlohmann::ordered_json> log_history;
  ProgramCacheStats programs;
  bool interrupted = false;
};

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
  struct State;
  std::unique_ptr<State> s_;
};

// The learning rate at `step` (0-based) of `total` steps with `warmup` warm-up steps.
double scheduled_lr(const std::string& type, double base, int64_t step, int64_t total, int64_t warmup);

}  // namespace trl

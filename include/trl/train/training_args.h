// Transformers' TrainingArguments as trl.cpp's trainers share them (docs/TRAINING.md, "The Trainer"): one struct
// that every method's config (SFTConfig, DPOConfig, ...) extends with its own fields, as TRL's configs extend
// TrainingArguments. Option names and defaults are Transformers' with TRL's overrides (logging_steps 10, bf16 on);
// each config sets its own learning rate.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/backend/program_cache.h"
#include "trl/models/lora.h"

namespace trl {

// How the ranks of a distributed run (docs/DISTRIBUTED.md) split the model: tp_size ranks hold a slice of every
// layer (tensor parallel), fsdp_size ranks a shard of the weights, gradients and optimizer state; data parallel
// takes what is left of the world size (world = dp × fsdp × tp).
struct DistributedConfig {
  int64_t tp_size = 1;
  int64_t fsdp_size = 1;
  // Expert parallel (a mixture of experts): the ep_size ranks of a model replica each hold 1/ep_size of every sparse
  // layer's experts (weights, masters, moments) and run their experts on the tokens routed to them; an all-reduce
  // sums the ranks' parts. They are the tensor-parallel group, as Transformers runs expert parallel on its tensor-
  // parallel mesh: ep_size > 1 is tp_size = ep_size (a tp_size given too must equal it), and tp_size > 1 on a
  // mixture of experts splits its experts the same way. docs/DISTRIBUTED.md.
  int64_t ep_size = 1;
  // Transformers' older switch (DistributedConfig(enable_expert_parallel=True)): expert parallel over the tp_size
  // ranks, which trl.cpp does on a mixture of experts anyway; accepted, and it needs tp_size > 1 and experts.
  bool enable_expert_parallel = false;
  // The ranks of one model replica's tensor- (and expert-) parallel group.
  int64_t model_parallel_size() const { return std::max(tp_size, ep_size); }
};

struct TrainingArguments {
  std::string output_dir = "trainer_output";
  double learning_rate = 5e-5;
  int64_t per_device_train_batch_size = 8;
  int64_t per_device_eval_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double num_train_epochs = 3;
  int64_t max_steps = -1;
  std::string lr_scheduler_type = "linear";  // linear | cosine | cosine_with_min_lr | constant | constant_with_warmup
  // Transformers' lr_scheduler_kwargs: num_cycles (cosine, cosine_with_min_lr; default 0.5), and min_lr or
  // min_lr_rate (cosine_with_min_lr: one of them).
  nlohmann::ordered_json lr_scheduler_kwargs = nlohmann::ordered_json::object();
  // Transformers' optimizer name: the AdamW family (adamw_torch, adamw_torch_fused, ...) is trl.cpp's AdamW; others
  // are refused by check_training_arguments.
  std::string optim = "adamw_torch";
  double warmup_ratio = 0;
  // Transformers v5: a whole number of steps (>= 1; a fraction is dropped, as int() does), or a value in (0, 1) as
  // a ratio of the total steps (ceil); 0 defers to warmup_ratio.
  double warmup_steps = 0;
  double weight_decay = 0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  int64_t logging_steps = 10;
  bool logging_first_step = false;  // log the first step too (Transformers' option)
  int64_t save_steps = 500;
  std::optional<int64_t> save_total_limit;
  std::string eval_strategy = "no";  // no | steps | epoch
  std::optional<int64_t> eval_steps;  // default: logging_steps
  uint64_t seed = 42;
  // random: a seeded shuffle every epoch; sequential: the dataset's order (KTO's default: its KL pairs are formed
  // within fixed batches).
  std::string train_sampling_strategy = "random";
  bool bf16 = true;
  bool torch_compile = true;  // the compiled CPU backend; false: the reference backend (the oracle; slow)
  // Transformers' default (TRL's configs say true): trl.cpp checks the memory a run needs before its first step and
  // names this option when it would make the run fit.
  bool gradient_checkpointing = false;
  // When the memory check finds that per_device_train_batch_size does not fit, train with the largest smaller one
  // that does (found from the programs' plans before the first step, not by running out of memory and retrying);
  // gradient_accumulation_steps stays as given, as in Transformers. A resumed run keeps its checkpoint's.
  bool auto_find_batch_size = false;
  bool dataloader_drop_last = false;
  std::string resume_from_checkpoint;  // a checkpoint folder, or "last" / "true" for the newest in output_dir
  bool report = true;    // write training_report.html in output_dir
  // Transformers' report_to: "tensorboard" (or "all") writes TensorBoard event files into logging_dir (default
  // output_dir/runs/<date>_<host>, Transformers' default); other integrations are not available here.
  std::vector<std::string> report_to;
  std::string logging_dir;
  bool progress = true;  // progress bar on a terminal, plain lines otherwise
  // Names shown in the report's run summary (TRL's ModelConfig.model_name_or_path and ScriptArguments.dataset_name;
  // the trainer itself never loads by them). Default: the model's folder and the training rows' file.
  std::string model_name_or_path;
  std::string dataset_name;
  DistributedConfig distributed;
  // LoRA (TRL's peft_config, docs/LORA.md): train an adapter of this configuration, initialised from `seed`, on the
  // frozen base weights; the model and checkpoints are saved as PEFT adapters.
  std::optional<LoraConfig> peft_config;
};

// Checks every option as TrainingArguments and torch.optim.AdamW do: finite numbers in range (learning_rate >= 0,
// adam_beta1/2 in [0, 1), adam_epsilon > 0, weight_decay >= 0, max_grad_norm >= 0, warmup_ratio in [0, 1],
// num_train_epochs > 0), whole-number options >= 1, known names, seed in numpy's [0, 2^32 - 1]. Throws trl::Error
// "<config_name>: <option> must be ..., got <value>".
void check_training_arguments(const TrainingArguments& args, const char* config_name);

struct TrainOutput {
  int64_t global_step = 0;
  double training_loss = 0;  // mean of the losses of the steps this run made (a resumed run: its own)
  std::vector<nlohmann::ordered_json> log_history;
  ProgramCacheStats programs;
  bool interrupted = false;
};

// The arguments as JSON (the fields above, by name), as TrainingArguments.to_json_string() shows them: what
// TensorBoard's "args" text holds.
nlohmann::ordered_json training_arguments_json(const TrainingArguments& args);

// The learning rate at `step` (0-based) of `total` steps with `warmup` warm-up steps, as Transformers' schedules give
// it; `min_lr_rate` and `num_cycles` are the cosine schedules' (lr_scheduler_kwargs).
double scheduled_lr(const std::string& type, double base, int64_t step, int64_t total, int64_t warmup, double min_lr_rate = 0, double num_cycles = 0.5);
// The schedule's min_lr_rate and num_cycles from lr_scheduler_kwargs (checked by check_training_arguments).
std::pair<double, double> scheduler_rates(const TrainingArguments& args);

}  // namespace trl

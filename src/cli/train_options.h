// What `trl sft`, `trl dpo` (and the later trainers) share on the command line: the model and dataset options of
// TRL's ModelConfig and ScriptArguments, every TrainingArguments option, and the Transformers/TRL options that
// change nothing here (accepted so that pasted command lines and YAML files run unchanged).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/options.h"
#include "trl/data/dataset.h"
#include "trl/models/causal_lm.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/training_args.h"

namespace trl::cli {

struct CompatArgs {
  std::string run_name, hub_model_id, attn_implementation, dataset_config, save_strategy = "steps", logging_strategy = "steps";
  bool push_to_hub = false, dataset_streaming = false, overwrite_output_dir = false, do_train = false, do_eval = false, trust_remote_code = false;
  bool save_only_model = false, remove_unused_columns = true;
  // TRL's ModelConfig quantization options: refused (no QLoRA here) with what to use instead.
  bool load_in_4bit = false, load_in_8bit = false, use_bnb_nested_quant = false;
  std::string bnb_4bit_quant_type = "nf4";
  std::optional<int64_t> dataloader_num_workers, dataset_num_proc;
};

// TRL's ModelConfig LoRA options (docs/LORA.md), with TRL's defaults.
struct PeftArgs {
  bool use_peft = false, use_rslora = false, use_dora = false;
  int64_t lora_r = 16;
  double lora_alpha = 32, lora_dropout = 0.05;
  std::vector<std::string> lora_target_modules, lora_target_parameters, lora_modules_to_save;
  std::string lora_task_type = "CAUSAL_LM";
};

struct TrainCommandArgs {
  std::string config, model, dataset, train_split = "train", test_split = "test", dtype = "auto", revision = "main";
  std::string device = "auto";  // the backend training runs on (the model's LoadOptions::device)
  std::optional<int64_t> save_total_limit, eval_steps;
  // TRL's dataset mixture (DatasetMixtureConfig): `datasets:` as JSON text, `streaming`, `test_split_size`.
  std::string datasets;
  std::string lr_scheduler_kwargs;  // JSON text (a YAML mapping in --config), into TrainingArguments::lr_scheduler_kwargs
  bool streaming = false;
  std::optional<double> test_split_size;
  CompatArgs compat;
  PeftArgs peft;
  // What the run trains on, for the status line: --dataset_name, or the mixture's paths.
  std::string dataset_label() const;
};

// Registers --config, the model and dataset options, every TrainingArguments option and the compatibility ones.
void add_training_options(Options& o, TrainingArguments& c, TrainCommandArgs& a);

// After parsing (and --config): the required options, the compatibility notes, and the fields the command line
// holds apart (save_total_limit, eval_steps, save_strategy no, resume_from_checkpoint None/false) copied into `c`.
void finish_training_options(const char* command, TrainingArguments& c, const TrainCommandArgs& a);

struct TrainRun {
  CausalLM model;
  Tokenizer tokenizer;
  Dataset train;
  std::optional<Dataset> eval;
};
// Runs a config check (check_sft_config, ...): what it refuses is a ConfigError.
template <class Check>
void check_config(Check&& check) {
  try {
    check();
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
}

// A run and the frozen model beside it (DPO's and KTO's reference; GRPO's and RLOO's when beta > 0).
struct RunWithReference {
  TrainRun run;
  std::optional<CausalLM> ref;
};
// The train split (and the test split when evaluating): of --dataset_name, or of the datasets: mixture.
struct TrainData {
  Dataset train;
  std::optional<Dataset> eval;
};
TrainData load_train_data(const TrainCommandArgs& a, const TrainingArguments& c);
// Loads the model (dtype, revision), its tokenizer, and the train split (and the test split when evaluating).
TrainRun load_train_run(const TrainCommandArgs& a, const TrainingArguments& c);

// --ref_model_name_or_path: the frozen reference in the compute dtype (bf16 under --bf16), or nullopt for "" / None.
std::optional<CausalLM> load_ref_model(const std::string& name_or_path, const TrainCommandArgs& a, const TrainingArguments& c);

// The one-line JSON summary a training command prints on stdout (with the generator's program counters for the
// online methods); exits 130 when interrupted.
void print_train_output(const TrainOutput& out, const ProgramCacheStats* generation = nullptr);

}  // namespace trl::cli

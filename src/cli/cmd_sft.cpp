// `trl sft`: supervised fine-tuning with TRL's option names, from flags or a YAML config (`--config sft.yaml`, the
// same keys as the flags; flags given on the command line win).
#include <cstdio>
#include <fstream>

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/cli_util.h"
#include "core/error.h"
#include "data/dataset.h"
#include "tokenizer/tokenizer.h"
#include "train/sft_trainer.h"

namespace trl::cli {

namespace {

// Applies a YAML config file to the options of `cmd`: every key must be an option; a key also given on the command
// line keeps the command line's value; null keeps the default (None).
void apply_yaml_config(CLI::App* cmd, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail("--config {}: cannot open", path);
  } catch (const YAML::Exception& e) {
    fail("--config {}: not valid YAML (line {}, column {}): {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) fail("--config {}: the file must be a mapping of option: value", path);
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    CLI::Option* opt = cmd->get_option_no_throw("--" + key);
    if (opt == nullptr || key == "config") fail("--config {}: unknown option '{}' (see trl {} --help)", path, key, cmd->get_name());
    if (opt->count() > 0 || kv.second.IsNull()) continue;  // the command line wins; null = the default
    std::vector<std::string> values;
    if (kv.second.IsScalar()) values.push_back(kv.second.as<std::string>());
    else if (kv.second.IsSequence())
      for (const auto& x : kv.second) values.push_back(x.as<std::string>());
    else fail("--config {}: '{}' must be a value or a list", path, key);
    try {
      for (const auto& v : values) opt->add_result(v);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      fail("--config {}: '{}': {}", path, key, e.what());
    }
  }
}

}  // namespace

void register_sft(CLI::App& app) {
  auto* cmd = app.add_subcommand("sft", "Supervised fine-tuning (TRL's SFTTrainer): trl sft --model_name_or_path M --dataset_name data.jsonl");
  struct Args {
    SFTConfig c;
    std::string config, model, dataset, train_split = "train", test_split = "test", dtype, revision = "main", completion_only_loss = "None";
  };
  auto a = std::make_shared<Args>();
  SFTConfig& c = a->c;
  cmd->add_option("--config", a->config, "A YAML file of options (keys as the flags; flags on the command line win)");
  cmd->add_option(flag("model_name_or_path"), a->model, "Model folder or Hugging Face id (local cache only; required)");
  cmd->add_option(flag("dataset_name"), a->dataset, "A .jsonl/.json file or a folder with <split>.jsonl (required)");
  cmd->add_option(flag("dataset_train_split"), a->train_split, "Training split")->capture_default_str();
  cmd->add_option(flag("dataset_test_split"), a->test_split, "Evaluation split (used when eval_strategy is not no)")->capture_default_str();
  cmd->add_option(flag("torch_dtype") + "," + flag("dtype"), a->dtype, "Load the weights as f32 | bf16 (default: the checkpoint's)");
  cmd->add_option(flag("model_revision") + "," + flag("revision"), a->revision, "Hub cache revision")->capture_default_str();
  cmd->add_option(flag("output_dir"), c.output_dir, "Where checkpoints, logs and the final model go")->capture_default_str();
  cmd->add_option(flag("learning_rate"), c.learning_rate, "Peak learning rate")->capture_default_str();
  cmd->add_option(flag("per_device_train_batch_size"), c.per_device_train_batch_size, "Rows per micro-batch")->capture_default_str();
  cmd->add_option(flag("per_device_eval_batch_size"), c.per_device_eval_batch_size, "Rows per eval batch")->capture_default_str();
  cmd->add_option(flag("gradient_accumulation_steps"), c.gradient_accumulation_steps, "Micro-batches per optimizer step")->capture_default_str();
  cmd->add_option(flag("num_train_epochs"), c.num_train_epochs, "Epochs (when max_steps is not set)")->capture_default_str();
  cmd->add_option(flag("max_steps"), c.max_steps, "Optimizer steps (overrides epochs; -1 = off)")->capture_default_str();
  cmd->add_option(flag("lr_scheduler_type"), c.lr_scheduler_type, "linear | cosine | constant | constant_with_warmup")
      ->check(CLI::IsMember({"linear", "cosine", "constant", "constant_with_warmup"}))
      ->capture_default_str();
  cmd->add_option(flag("warmup_ratio"), c.warmup_ratio, "Warm-up as a fraction of the steps")->capture_default_str();
  cmd->add_option(flag("warmup_steps"), c.warmup_steps, "Warm-up steps (wins over warmup_ratio)")->capture_default_str();
  cmd->add_option(flag("weight_decay"), c.weight_decay, "AdamW weight decay (not on norms and biases)")->capture_default_str();
  cmd->add_option(flag("adam_beta1"), c.adam_beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option(flag("adam_beta2"), c.adam_beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option(flag("adam_epsilon"), c.adam_epsilon, "AdamW epsilon")->capture_default_str();
  cmd->add_option(flag("max_grad_norm"), c.max_grad_norm, "Global-norm clipping (0 = off)")->capture_default_str();
  cmd->add_option(flag("logging_steps"), c.logging_steps, "Log every N steps")->capture_default_str();
  cmd->add_option(flag("save_steps"), c.save_steps, "Save a checkpoint every N steps")->capture_default_str();
  cmd->add_option(flag("save_total_limit"), c.save_total_limit, "Keep at most N checkpoints (default: all)");
  cmd->add_option(flag("eval_strategy"), c.eval_strategy, "no | steps | epoch")->check(CLI::IsMember({"no", "steps", "epoch"}))->capture_default_str();
  cmd->add_option(flag("eval_steps"), c.eval_steps, "Evaluate every N steps (default: logging_steps)");
  cmd->add_option(flag("seed"), c.seed, "Seed of the data order")->capture_default_str();
  cmd->add_flag(flag("bf16"), c.bf16, "bf16 compute with f32 master weights (--bf16=false: f32)")->capture_default_str();
  cmd->add_flag(flag("torch_compile"), c.torch_compile, "The compiled CPU backend (--torch_compile=false: the reference backend)")->capture_default_str();
  cmd->add_flag(flag("gradient_checkpointing"), c.gradient_checkpointing, "Recompute each layer in the backward pass")->capture_default_str();
  cmd->add_flag(flag("dataloader_drop_last"), c.dataloader_drop_last, "Drop the last incomplete batch")->capture_default_str();
  cmd->add_option(flag("resume_from_checkpoint"), c.resume_from_checkpoint, "A checkpoint folder, or \"last\"");
  cmd->add_option(flag("max_length"), c.max_length, "Truncate (or pack) to this many tokens")->capture_default_str();
  cmd->add_flag(flag("packing"), c.packing, "Pack examples into rows of max_length (best-fit decreasing)")->capture_default_str();
  cmd->add_flag(flag("padding_free"), c.padding_free, "One row per micro-batch, no padding between examples")->capture_default_str();
  cmd->add_option(flag("completion_only_loss"), a->completion_only_loss, "None | true | false")->capture_default_str();
  cmd->add_flag(flag("assistant_only_loss"), c.assistant_only_loss, "Loss on assistant turns only")->capture_default_str();
  cmd->add_option(flag("pad_to_multiple_of"), c.pad_to_multiple_of, "None | auto | N (auto = 64 on the CPU backend)")->capture_default_str();
  cmd->add_option(flag("dataset_text_field"), c.dataset_text_field, "Field of language-modelling rows")->capture_default_str();
  cmd->add_option(flag("eos_token"), c.eos_token, "Appended to non-chat text (default: the tokenizer's)");
  cmd->add_flag(flag("report"), c.report, "Write training_report.html")->capture_default_str();
  cmd->callback([a, cmd] {
    if (!a->config.empty()) apply_yaml_config(cmd, a->config);
    if (a->model.empty()) fail("trl sft: --model_name_or_path is required (on the command line or in --config)");
    if (a->dataset.empty()) fail("trl sft: --dataset_name is required (on the command line or in --config)");
    SFTConfig cfg = a->c;
    const std::string col = a->completion_only_loss;
    if (col == "true" || col == "True") cfg.completion_only_loss = true;
    else if (col == "false" || col == "False") cfg.completion_only_loss = false;
    else if (col != "None" && col != "none" && !col.empty()) fail("--completion_only_loss '{}': expected None, true or false", col);
    LoadOptions lo;
    lo.revision = a->revision;
    if (!a->dtype.empty() && a->dtype != "auto") {
      auto dt = dtype_from_name(a->dtype == "bfloat16" ? "bf16" : a->dtype == "float32" ? "f32" : a->dtype);
      if (!dt || !dtype_is_float(*dt)) fail("--torch_dtype '{}': expected f32, bf16 or auto", a->dtype);
      lo.dtype = dt;
    }
    const CausalLM model = CausalLM::from_pretrained(a->model, lo);
    const Tokenizer tok = Tokenizer::from_pretrained(a->model, a->revision);
    Dataset train = load_dataset(a->dataset, a->train_split);
    std::optional<Dataset> eval;
    if (cfg.eval_strategy != "no") eval = load_dataset(a->dataset, a->test_split);
    std::fprintf(stderr, "[trl] sft: %s on %s (%zu rows), output %s\n", a->model.c_str(), a->dataset.c_str(), train.size(), cfg.output_dir.c_str());
    SFTTrainer trainer(model, tok, std::move(train), cfg, std::move(eval));
    const TrainOutput out = trainer.train();
    std::printf("{\"global_step\": %lld, \"training_loss\": %.6f, \"programs_compiled\": %lld, \"cache_hits\": %lld, \"interrupted\": %s}\n",
                static_cast<long long>(out.global_step), out.training_loss, static_cast<long long>(out.programs.compilations),
                static_cast<long long>(out.programs.hits), out.interrupted ? "true" : "false");
    if (out.interrupted) std::exit(130);
  });
}

}  // namespace trl::cli

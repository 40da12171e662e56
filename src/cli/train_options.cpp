#include "cli/train_options.h"
#include "cli/embed.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "trl/core/error.h"
#include "trl/data/mixture.h"
#include "trl/dist/communicator.h"

namespace trl::cli {

namespace {

void add_compat_options(Options& o, CompatArgs& x) {
  o.add("run_name", x.run_name, "Accepted for TRL compatibility (shown in the report)");
  o.add("push_to_hub", x.push_to_hub, "Not available (no network): the model stays in output_dir");
  o.add("hub_model_id", x.hub_model_id, "Accepted for TRL compatibility (nothing is pushed)");
  o.add("overwrite_output_dir", x.overwrite_output_dir, "Accepted for TRL compatibility");
  o.add("do_train", x.do_train, "Accepted for TRL compatibility (trl sft always trains)");
  o.add("do_eval", x.do_eval, "Accepted for TRL compatibility (see eval_strategy)");
  o.add("trust_remote_code", x.trust_remote_code, "Accepted for TRL compatibility (no remote code runs here)");
  o.add("attn_implementation", x.attn_implementation, "Accepted for TRL compatibility (trl.cpp's own fused attention is used)");
  o.add("dataset_config", x.dataset_config, "Dataset configuration: a `configs:` entry of the dataset's README.md, or its <config>/ folder");
  o.add("dataset_streaming", x.dataset_streaming, "Accepted for TRL compatibility (Parquet files are always read a row group at a time)");
  o.add("dataloader_num_workers", x.dataloader_num_workers, "Accepted for TRL compatibility (data loading is in-process)");
  o.add("dataset_num_proc", x.dataset_num_proc, "Accepted for TRL compatibility (tokenization runs in this process)");
  o.add("save_strategy", x.save_strategy, "steps (every save_steps) | no").choices({"steps", "no"});
  o.add("logging_strategy", x.logging_strategy, "steps (every logging_steps)").choices({"steps"});
  o.add("remove_unused_columns", x.remove_unused_columns, "Accepted for TRL compatibility (the trainers read the columns they need)");
  o.add("load_in_4bit", x.load_in_4bit, "QLoRA's 4-bit base weights: not available (train LoRA on the bf16 model: --use_peft)");
  o.add("load_in_8bit", x.load_in_8bit, "8-bit base weights: not available (train LoRA on the bf16 model: --use_peft)");
  o.add("bnb_4bit_quant_type", x.bnb_4bit_quant_type, "With --load_in_4bit only (not available)").choices({"nf4", "fp4"});
  o.add("use_bnb_nested_quant", x.use_bnb_nested_quant, "With --load_in_4bit only (not available)");
  o.add("save_only_model", x.save_only_model, "Accepted for TRL compatibility (checkpoints keep the optimizer state for exact resume)");
}

void add_peft_options(Options& o, PeftArgs& p) {
  o.add("use_peft", p.use_peft, "Train a LoRA adapter on the frozen model (PEFT's format; docs/LORA.md)");
  o.add("lora_r", p.lora_r, "LoRA rank").min(1);
  o.add("lora_alpha", p.lora_alpha, "LoRA alpha: the adapter's output is scaled by lora_alpha / lora_r").above(0);
  o.add("lora_dropout", p.lora_dropout, "Dropout on the adapters' input while training").min(0).below(1);
  o.add("lora_target_modules", p.lora_target_modules, "Linear modules to adapt: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, or all-linear")
      .default_text("None (q_proj, v_proj)");
  o.add("lora_target_parameters", p.lora_target_parameters,
        "Parameters to adapt (PEFT's target_parameters): a mixture of experts' mlp.gate.weight, mlp.experts.gate_up_proj, "
        "mlp.experts.down_proj (needs --lora_dropout 0)")
      .default_text("None");
  o.add("lora_modules_to_save", p.lora_modules_to_save, "Modules trained in full beside the adapters (such as lm_head, embed_tokens)");
  o.add("lora_task_type", p.lora_task_type, "PEFT task type written to adapter_config.json").choices({"CAUSAL_LM", "SEQ_CLS"});
  o.add("use_rslora", p.use_rslora, "Rank-stabilised LoRA: scale by lora_alpha / sqrt(lora_r)");
  o.add("use_dora", p.use_dora, "DoRA (not available: plain LoRA only)");
}

// TRL's get_peft_config: a LoraConfig when --use_peft, else none.
std::optional<LoraConfig> peft_config(const PeftArgs& p) {
  if (!p.use_peft) return std::nullopt;
  if (p.use_dora) usage_fail("--use_dora: DoRA adapters are not implemented in trl.cpp; train a plain LoRA adapter (drop --use_dora)");
  LoraConfig c;
  c.r = p.lora_r;
  c.lora_alpha = p.lora_alpha;
  c.lora_dropout = p.lora_dropout;
  c.use_rslora = p.use_rslora;
  c.task_type = p.lora_task_type;
  c.modules_to_save = p.lora_modules_to_save;
  // One value naming several modules with commas (a YAML string) is split, as TRL's list parsing would.
  auto split = [](const std::vector<std::string>& values, std::vector<std::string>& out) {
    for (const std::string& v : values)
      for (size_t at = 0; at <= v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        if (comma > at) out.push_back(v.substr(at, comma - at));
        at = comma + 1;
      }
  };
  split(p.lora_target_modules, c.target_modules);
  split(p.lora_target_parameters, c.target_parameters);
  return c;
}

DatasetMixture mixture_of(const TrainCommandArgs& a) {
  const nlohmann::json j = nlohmann::json::parse(a.datasets, nullptr, false);
  if (j.is_discarded()) usage_fail("--datasets: not JSON: give a list such as [{{\"path\": \"trl-lib/Capybara\"}}] (a YAML list in --config)");
  try {
    DatasetMixture m = parse_dataset_mixture(j, "--datasets");
    m.streaming = a.streaming;
    m.test_split_size = a.test_split_size;
    if (m.streaming && m.datasets.front().fraction) usage_fail("--datasets: a dataset fraction is not supported with streaming: true (as in TRL)");
    return m;
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

void check_compat(const CompatArgs& x, const TrainingArguments& c) {
  for (const auto& [given, flag] : {std::pair{x.load_in_4bit, "--load_in_4bit"}, std::pair{x.load_in_8bit, "--load_in_8bit"}})
    if (given)
      usage_fail("{}: quantized base weights (QLoRA, bitsandbytes) are not implemented in trl.cpp; train a LoRA adapter on the bf16 model "
                 "instead (--use_peft with --bf16, the default; a 0.6B model's LoRA run fits in a few GiB, docs/LORA.md), and drop {}", flag, flag);
  if (x.push_to_hub) std::fprintf(stderr, "[trl] note: --push_to_hub ignored: no network here; the model is saved in --output_dir\n");
  for (const auto& r : c.report_to) {  // split at commas already (finish_training_options)
    if (r == "none" || r == "all" || r == "tensorboard") continue;
    if (r == "trackio" || r == "wandb" || r == "mlflow" || r == "comet_ml" || r == "clearml" || r == "neptune" || r == "swanlab")
      std::fprintf(stderr, "[trl] note: --report_to %s: not available here (no network, no Python); the metrics are in output_dir/log.jsonl and "
                           "training_report.html, and in TensorBoard's files with --report_to tensorboard\n", r.c_str());
    else
      usage_fail("--report_to {}: no such integration (trl.cpp writes tensorboard; none, all; Transformers' others are noted as unavailable)", r);
  }
}

}  // namespace

void add_training_options(Options& o, TrainingArguments& c, TrainCommandArgs& a) {
  o.add("config", a.config, "A YAML file of options (keys as the flags; flags on the command line win)");
  o.add("model_name_or_path", a.model, "Model folder or Hugging Face id (local cache only; required)");
  o.add("dataset_name", a.dataset, "A Hugging Face dataset id (local cache only), a folder, or a .parquet/.jsonl/.json file (or datasets:; docs/DATASETS.md)");
  o.add("datasets", a.datasets,
        "A dataset mixture, TRL's `datasets:` list in a YAML config (each: path, name, data_dir, data_files, split, columns, fraction; "
        "docs/DATASETS.md); used instead of dataset_name")
      .json_list();
  o.add("streaming", a.streaming, "With datasets: accepted (a mixture's rows are read into memory)");
  o.add("test_split_size", a.test_split_size, "With datasets: split the mixture into train and test (a fraction, or a number of rows)").above(0);
  o.add("dataset_train_split", a.train_split, "Training split");
  o.add("dataset_test_split", a.test_split, "Evaluation split (used when eval_strategy is not no)");
  o.add("device", a.device, "auto | cpu | cuda: the backend training runs on (one that is not here is an error)");
  o.add("torch_dtype,dtype", a.dtype, "Load the weights as").choices({"auto", "f32", "float32", "bf16", "bfloat16"}).default_text("auto (the checkpoint's)");
  o.add("model_revision,revision", a.revision, "Hub cache revision");
  o.add("output_dir", c.output_dir, "Where checkpoints, logs and the final model go");
  o.add("learning_rate", c.learning_rate, "Peak learning rate").min(0);
  o.add("per_device_train_batch_size", c.per_device_train_batch_size, "Rows per micro-batch").min(1);
  o.add("per_device_eval_batch_size", c.per_device_eval_batch_size, "Rows per eval batch").min(1);
  o.add("gradient_accumulation_steps", c.gradient_accumulation_steps, "Micro-batches per optimizer step").min(1);
  o.add("num_train_epochs", c.num_train_epochs, "Epochs (when max_steps is not set)").above(0);
  o.add("max_steps", c.max_steps, "Optimizer steps (overrides epochs; -1 = off)").min(-1);
  o.add("lr_scheduler_type", c.lr_scheduler_type, "Learning-rate schedule")
      .choices({"linear", "cosine", "cosine_with_min_lr", "constant", "constant_with_warmup"});
  o.add("lr_scheduler_kwargs", a.lr_scheduler_kwargs, "The schedule's arguments as JSON: num_cycles (cosine), min_lr or min_lr_rate (cosine_with_min_lr)")
      .json_object();
  o.add("optim", c.optim, "Optimizer: the AdamW family (adamw_torch, adamw_torch_fused, ...) is trl.cpp's AdamW; others are refused");
  o.add("warmup_ratio", c.warmup_ratio, "Warm-up as a fraction of the steps").min(0).max(1);
  o.add("warmup_steps", c.warmup_steps, "Warm-up steps, or a value in (0, 1) as a ratio of the total steps (wins over warmup_ratio)").min(0);
  o.add("weight_decay", c.weight_decay, "AdamW weight decay (not on norms and biases)").min(0);
  o.add("adam_beta1", c.adam_beta1, "AdamW beta1").min(0).below(1);
  o.add("adam_beta2", c.adam_beta2, "AdamW beta2").min(0).below(1);
  o.add("adam_epsilon", c.adam_epsilon, "AdamW epsilon").above(0);
  o.add("max_grad_norm", c.max_grad_norm, "Global-norm clipping (0 = off)").min(0);
  o.add("logging_steps", c.logging_steps, "Log every N steps").min(1);
  o.add("logging_first_step", c.logging_first_step, "Log the first step too");
  o.add("save_steps", c.save_steps, "Save a checkpoint every N steps").min(1);
  o.add("save_total_limit", a.save_total_limit, "Keep at most N checkpoints (None: all)").min(1);
  o.add("eval_strategy", c.eval_strategy, "When to evaluate").choices({"no", "steps", "epoch"});
  o.add("eval_steps", a.eval_steps, "Evaluate every N steps").min(1).default_text("None (logging_steps)");
  o.add("seed", c.seed, "Seed of the data order");
  o.add("train_sampling_strategy", c.train_sampling_strategy, "random (shuffled every epoch) | sequential (the dataset's order)")
      .choices({"random", "sequential"});
  o.add("bf16", c.bf16, "bf16 compute with f32 master weights (--bf16 false: f32)");
  o.add("torch_compile", c.torch_compile, "The compiled CPU backend (--torch_compile false: the reference backend)");
  o.add("gradient_checkpointing", c.gradient_checkpointing, "Recompute each layer in the backward pass");
  o.add("auto_find_batch_size", c.auto_find_batch_size,
        "When per_device_train_batch_size does not fit in memory, train with the largest smaller one that does (from the plans)");
  o.add("dataloader_drop_last", c.dataloader_drop_last, "Drop the last incomplete batch");
  o.add("resume_from_checkpoint", c.resume_from_checkpoint, "A checkpoint folder, or \"last\" (the newest in output_dir)").default_text("None");
  o.add("report", c.report, "Write training_report.html");
  o.add("report_to", c.report_to, "tensorboard (or all): TensorBoard event files in logging_dir; none. Metrics always go to log.jsonl");
  o.add("logging_dir", c.logging_dir, "TensorBoard's folder").default_text("output_dir/runs/<date>_<host>");
  o.add("tp_size", c.distributed.tp_size, "Tensor-parallel ranks per model replica (docs/DISTRIBUTED.md)").min(1);
  o.add("ep_size", c.distributed.ep_size, "Expert-parallel ranks per model replica: a mixture of experts' experts split between them (the tensor-parallel group)")
      .min(1);
  o.add("enable_expert_parallel", c.distributed.enable_expert_parallel,
        "Transformers' older switch: expert parallel over the tp_size ranks (what tp_size does on a mixture of experts)");
  o.add("fsdp_size", c.distributed.fsdp_size, "Ranks that shard the f32 masters, gradient sums and AdamW moments between them (docs/DISTRIBUTED.md)").min(1);
  add_compat_options(o, a.compat);
  add_peft_options(o, a.peft);
}

void finish_training_options(const char* command, TrainingArguments& c, const TrainCommandArgs& a) {
  if (a.model.empty()) usage_fail("trl {}: --model_name_or_path is required (on the command line or in --config)", command);
  if (a.dataset.empty() && a.datasets.empty())
    usage_fail("trl {}: --dataset_name is required (on the command line or in --config; or a datasets: mixture in --config)", command);
  if (!a.datasets.empty()) {
    (void)mixture_of(a);  // a mixture that does not parse is a usage error, before anything loads
    if (!a.dataset.empty() && dist::world().rank() == 0)
      std::fprintf(stderr, "[trl] note: both datasets: and --dataset_name given: the mixture is used and --dataset_name %s ignored (as in TRL)\n",
                   a.dataset.c_str());
  } else if (a.test_split_size) {
    usage_fail("trl {}: --test_split_size splits a datasets: mixture; with --dataset_name, use the dataset's test split (--dataset_test_split)", command);
  }
  std::vector<std::string> report_to;  // "tensorboard,wandb" as Transformers splits it
  for (const std::string& v : c.report_to)
    for (size_t at = 0; at <= v.size();) {
      const size_t comma = std::min(v.find(',', at), v.size());
      if (comma > at) report_to.push_back(v.substr(at, comma - at));
      at = comma + 1;
    }
  c.report_to = report_to;
  check_compat(a.compat, c);
  if (!a.lr_scheduler_kwargs.empty() && !is_none(a.lr_scheduler_kwargs)) {
    c.lr_scheduler_kwargs = nlohmann::ordered_json::parse(a.lr_scheduler_kwargs, nullptr, false);
    if (!c.lr_scheduler_kwargs.is_object())
      usage_fail("--lr_scheduler_kwargs: expected a JSON object such as '{{\"min_lr_rate\": 0.1}}', got {}", a.lr_scheduler_kwargs);
  }
  c.save_total_limit = a.save_total_limit;
  c.eval_steps = a.eval_steps;
  if (a.compat.save_strategy == "no") c.save_steps = std::numeric_limits<int64_t>::max();
  if (is_none(c.resume_from_checkpoint) || c.resume_from_checkpoint == "false" || c.resume_from_checkpoint == "False") c.resume_from_checkpoint.clear();
  c.model_name_or_path = a.model;
  c.dataset_name = a.dataset_label();
  c.peft_config = peft_config(a.peft);
  try {  // the options' values together, before anything loads: a usage error
    check_training_arguments(c, fmt::format("trl {}", command).c_str());
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

TrainData load_train_data(const TrainCommandArgs& a, const TrainingArguments& c) {
  if (a.datasets.empty()) {
    TrainData d{load_dataset(a.dataset, a.train_split, a.compat.dataset_config), std::nullopt};
    if (c.eval_strategy != "no" || (embedded_call() != nullptr && embedded_call()->load_eval_split))
      d.eval = load_dataset(a.dataset, a.test_split, a.compat.dataset_config);
    return d;
  }
  std::map<std::string, Dataset> splits = load_dataset_mixture(mixture_of(a), c.seed);
  const auto split = [&](const std::string& name) {
    const auto it = splits.find(name);
    if (it == splits.end())
      fail("datasets: the mixture has the split{} {}, not \"{}\"{}", splits.size() > 1 ? "s" : "", splits.size() > 1 ? "train and test" : "train", name,
           splits.size() > 1 ? "" : " (test_split_size makes a test split)");
    return std::move(it->second);
  };
  std::optional<Dataset> eval;
  if (c.eval_strategy != "no" || (embedded_call() != nullptr && embedded_call()->load_eval_split)) eval = split(a.test_split);
  return TrainData{split(a.train_split), std::move(eval)};
}

TrainRun load_train_run(const TrainCommandArgs& a, const TrainingArguments& c) {
  LoadOptions lo;
  lo.revision = a.revision;
  if (a.dtype != "auto") lo.dtype = (a.dtype == "bf16" || a.dtype == "bfloat16") ? DType::BF16 : DType::F32;
  lo.device = a.device;
  TrainData data = load_train_data(a, c);  // first: a dataset or mixture that is wrong fails before the model loads
  CausalLM model = CausalLM::from_pretrained(a.model, lo);
  Tokenizer tokenizer = Tokenizer::from_pretrained(a.model, a.revision);
  return TrainRun{std::move(model), std::move(tokenizer), std::move(data.train), std::move(data.eval)};
}

std::string TrainCommandArgs::dataset_label() const {
  if (datasets.empty()) return dataset;
  std::vector<std::string> paths;
  for (const auto& d : parse_dataset_mixture(nlohmann::json::parse(datasets), "datasets").datasets) paths.push_back(d.path);
  return fmt::format("a mixture of {}", fmt::join(paths, " + "));
}

std::optional<CausalLM> load_ref_model(const std::string& name_or_path, const TrainCommandArgs& a, const TrainingArguments& c) {
  if (name_or_path.empty() || is_none(name_or_path)) return std::nullopt;
  LoadOptions lo;
  lo.revision = a.revision;
  lo.dtype = c.bf16 ? DType::BF16 : DType::F32;  // the compute dtype: a frozen model needs no f32 masters
  return CausalLM::from_pretrained(name_or_path, lo);
}

EmbeddedCall*& embedded_call() {
  static thread_local EmbeddedCall* call = nullptr;
  return call;
}

void print_train_output(const TrainOutput& out, const ProgramCacheStats* generation) {
  if (dist::world().rank() != 0) {  // rank 0 speaks for the job
    if (out.interrupted) dist::finalize(), std::exit(130);
    return;
  }
  std::string gen;
  if (generation)
    gen = fmt::format(", \"generation_programs_compiled\": {}, \"generation_cache_hits\": {}, \"generation_compile_seconds\": {:.3f}",
                      generation->compilations, generation->hits, generation->compile_seconds);
  std::printf("{\"global_step\": %lld, \"training_loss\": %.6f, \"programs_compiled\": %lld, \"cache_hits\": %lld, \"compile_seconds\": %.3f%s, "
              "\"interrupted\": %s}\n",
              static_cast<long long>(out.global_step), out.training_loss, static_cast<long long>(out.programs.compilations),
              static_cast<long long>(out.programs.hits), out.programs.compile_seconds, gen.c_str(), out.interrupted ? "true" : "false");
  if (out.interrupted) std::fflush(stdout), dist::finalize(), std::exit(130);
}

}  // namespace trl::cli

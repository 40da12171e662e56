// `trl gkd` (TRL's GKDTrainer: SFT data, on-policy with probability lmbda) and `trl distill` (TRL's
// DistillationTrainer: prompts only, always on-policy), with TRL's option names, from flags or a YAML config.
#include <cstdio>
#include <optional>


#include "cli/cli_util.h"
#include "cli/embed.h"
#include "core/json_text.h"
#include "cli/train_options.h"
#include "trl/core/error.h"
#include "trl/train/gkd_trainer.h"

namespace trl::cli {

namespace {

struct TeacherArgs {
  std::string path, revision, init_kwargs;
};

// The teacher in the dtype that teacher_model_init_kwargs' "dtype" names ("auto": the checkpoint's), else the
// compute dtype (bf16 under --bf16), as a frozen model needs no f32 masters.
CausalLM load_teacher(const char* command, const TeacherArgs& t, const TrainCommandArgs& a, const TrainingArguments& c) {
  if (t.path.empty() || is_none(t.path))
    usage_fail("trl {}: --teacher_model_name_or_path is required (a model folder or a Hugging Face id in the local cache)", command);
  LoadOptions lo;
  lo.revision = t.revision.empty() || is_none(t.revision) ? a.revision : t.revision;
  lo.dtype = c.bf16 ? DType::BF16 : DType::F32;
  if (!t.init_kwargs.empty() && !is_none(t.init_kwargs)) {
    const nlohmann::ordered_json kw = parse_json<nlohmann::ordered_json>(t.init_kwargs, "--teacher_model_init_kwargs '" + t.init_kwargs + "'");
    if (!kw.is_object()) usage_fail("--teacher_model_init_kwargs must be a JSON object, got {}", t.init_kwargs);
    for (const auto& [k, v] : kw.items()) {
      if (k == "dtype" || k == "torch_dtype") {
        const std::string d = v.is_string() ? v.get<std::string>() : "";
        if (d == "auto") lo.dtype.reset();
        else if (d == "bfloat16") lo.dtype = DType::BF16;
        else if (d == "float32") lo.dtype = DType::F32;
        else usage_fail("--teacher_model_init_kwargs: dtype must be \"auto\", \"bfloat16\" or \"float32\", got {}", v.dump());
      } else if (k != "trust_remote_code" && k != "attn_implementation" && k != "use_cache" && k != "revision" && k != "device_map") {
        usage_fail("--teacher_model_init_kwargs: unknown key '{}' (known here: dtype, and trust_remote_code, attn_implementation, use_cache, "
             "device_map, which change nothing)",
             k);
      }
    }
  }
  return CausalLM::from_pretrained(t.path, lo);
}

void add_teacher_options(Options& o, TeacherArgs& t) {
  o.add("teacher_model_name_or_path", t.path, "The teacher (a folder or a local-cache id) with the student's vocabulary").default_text("None (required)");
  o.add("teacher_model_revision", t.revision, "Revision of the teacher in the local cache").default_text("the model's");
  o.add("teacher_model_init_kwargs", t.init_kwargs, "JSON: {\"dtype\": \"auto\" | \"bfloat16\" | \"float32\"} (default: the compute dtype)")
      .default_text("None")
      .json_object();
}

}  // namespace

void register_gkd(CLI::App& app) {
  auto* cmd = add_command(app, 
      "gkd", "Generalized knowledge distillation (TRL's GKDTrainer): trl gkd --model_name_or_path S --teacher_model_name_or_path T --dataset_name d.jsonl");
  struct Args {
    GKDConfig c;
    TrainCommandArgs t;
    TeacherArgs teacher;
  };
  auto a = std::make_shared<Args>();
  auto o = std::make_shared<Options>(cmd);
  GKDConfig& c = a->c;
  add_training_options(*o, c, a->t);
  add_teacher_options(*o, a->teacher);
  o->add("max_length", c.max_length, "Rows longer than this keep their last max_length tokens").min(2);
  // SFTConfig's options that GKDConfig inherits (pasted YAML files carry them): packing and padding_free are refused
  // when set; the loss is always on the completions.
  o->add("packing", c.packing, "Not supported by GKD (refused when true)");
  o->add("padding_free", c.padding_free, "Not supported by GKD (refused when true)");
  o->add("completion_only_loss", c.completion_only_loss, "Accepted; GKD's loss is always on the completions").default_text("None");
  o->add("assistant_only_loss", c.assistant_only_loss, "Accepted; GKD's loss is always on the completion (the last assistant turn)");
  o->add("dataset_text_field", c.dataset_text_field, "Accepted; GKD rows are conversations or prompt-completion pairs");
  o->add("pad_to_multiple_of", c.pad_to_multiple_of, "None | auto | N: the prompt and completion buckets (auto = the backend's, 64 on the CPU)");
  o->add("eos_token", c.eos_token, "Appended to text completions; must be one token of the vocabulary").default_text("the tokenizer's");
  o->add("temperature", c.temperature, "Sampling temperature of generated completions (the loss uses 1)").above(0);
  o->add("lmbda", c.lmbda, "Probability that a micro-batch's completions are the student's own (on-policy)").min(0).max(1);
  o->add("beta", c.beta, "Generalized JSD interpolation: 0 forward KL(teacher||student), 1 reverse KL").min(0).max(1);
  o->add("max_new_tokens", c.max_new_tokens, "Length limit of a generated completion").min(1);
  o->add("seq_kd", c.seq_kd, "When not on-policy, the teacher generates the completions (sequence-level KD)");
  o->add("disable_dropout", c.disable_dropout, "No dropout in the student (a LoRA adapter's included)");
  on_run(cmd, [a, o] {
    if (!a->t.config.empty()) o->apply_yaml(a->t.config);
    GKDConfig cfg = a->c;
    finish_training_options("gkd", cfg, a->t);
    cfg.teacher_model_name_or_path = a->teacher.path;
    check_config([&] { check_gkd_config(cfg); });  // before loading anything
    auto run = std::make_shared<RunWithReference>(RunWithReference{load_train_run(a->t, cfg), load_teacher("gkd", a->teacher, a->t, cfg)});
    std::fprintf(stderr, "[trl] gkd: %s from teacher %s on %s (%zu rows), output %s\n", a->t.model.c_str(), a->teacher.path.c_str(),
                 a->t.dataset_label().c_str(), run->run.train.size(), cfg.output_dir.c_str());
    deliver(prepared<GKDTrainer>("gkd", run, cfg.output_dir, run->run.model, *run->ref, run->run.tokenizer, std::move(run->run.train), cfg,
                                 std::move(run->run.eval)));
  });
}

void register_distill(CLI::App& app) {
  auto* cmd = add_command(app, "distill",
                                 "On-policy distillation (TRL's DistillationTrainer): trl distill --model_name_or_path S --teacher_model_name_or_path T "
                                 "--dataset_name prompts.jsonl");
  struct Args {
    DistillationConfig c;
    TrainCommandArgs t;
    TeacherArgs teacher;
    std::string chat_template_kwargs;
    bool use_vllm = false, log_completions = false;
    std::string vllm_mode;
    std::optional<int64_t> log_completions_steps, num_completions_to_print;
  };
  auto a = std::make_shared<Args>();
  auto o = std::make_shared<Options>(cmd);
  DistillationConfig& c = a->c;
  add_training_options(*o, c, a->t);
  add_teacher_options(*o, a->teacher);
  o->add("temperature", c.temperature, "Sampling temperature; also divides both models' logits in the loss").above(0);
  o->add("beta", c.beta, "Generalized JSD interpolation: 0 forward KL(teacher||student), 1 reverse KL").min(0).max(1);
  o->add("max_completion_length", c.max_completion_length, "Length limit of a generated completion").min(1);
  o->add("disable_dropout", c.disable_dropout, "No dropout in the student (a LoRA adapter's included)");
  o->add("num_generations", c.num_generations, "Completions per prompt").min(1);
  o->add("generation_batch_size", c.generation_batch_size, "Prompts per rank per optimizer step").min(1).default_text(
      "None (per_device_train_batch_size × gradient_accumulation_steps / num_generations)");
  o->add("top_p", c.top_p, "Nucleus sampling").above(0).max(1);
  o->add("top_k", c.top_k, "Top-k sampling (0: off)").min(0);
  o->add("pad_to_multiple_of", c.pad_to_multiple_of, "None | auto | N: the prompt and completion buckets (auto = the backend's, 64 on the CPU)");
  o->add("shuffle_dataset", c.shuffle_dataset, "Shuffle the prompts every epoch");
  o->add("chat_template_kwargs", a->chat_template_kwargs, "JSON object of chat template variables, e.g. '{\"enable_thinking\": false}'")
      .default_text("{}")
      .json_object();
  o->add("use_vllm", a->use_vllm, "Accepted; generation always uses trl.cpp's static-cache engine");
  o->add("vllm_mode", a->vllm_mode, "Accepted; ignored (no vLLM here)");
  o->add("log_completions", a->log_completions, "Accepted; the completion length metrics are always logged");
  o->add("log_completions_steps", a->log_completions_steps, "Accepted; ignored").default_text("100");
  o->add("num_completions_to_print", a->num_completions_to_print, "Accepted; ignored").default_text("None");
  on_run(cmd, [a, o] {
    if (!a->t.config.empty()) o->apply_yaml(a->t.config);
    DistillationConfig cfg = a->c;
    finish_training_options("distill", cfg, a->t);
    cfg.teacher_model_name_or_path = a->teacher.path;
    cfg.teacher_model_revision = a->teacher.revision;
    if (!a->chat_template_kwargs.empty()) {
      cfg.chat_template_kwargs = parse_json<nlohmann::ordered_json>(a->chat_template_kwargs, "--chat_template_kwargs '" + a->chat_template_kwargs + "'");
      if (!cfg.chat_template_kwargs.is_object())
        usage_fail("--chat_template_kwargs must be a JSON object of template variables, such as '{{\"enable_thinking\": false}}', got {}", a->chat_template_kwargs);
    }
    if (a->use_vllm) std::fprintf(stderr, "[trl] distill: use_vllm is ignored: completions come from trl.cpp's static-cache generator\n");
    check_config([&] { check_distillation_config(cfg); });
    auto run = std::make_shared<RunWithReference>(RunWithReference{load_train_run(a->t, cfg), load_teacher("distill", a->teacher, a->t, cfg)});
    std::fprintf(stderr, "[trl] distill: %s from teacher %s on %s (%zu prompts), output %s\n", a->t.model.c_str(), a->teacher.path.c_str(),
                 a->t.dataset_label().c_str(), run->run.train.size(), cfg.output_dir.c_str());
    deliver(prepared<DistillationTrainer>("distill", run, cfg.output_dir, run->run.model, *run->ref, run->run.tokenizer, std::move(run->run.train), cfg));
  });
}

}  // namespace trl::cli

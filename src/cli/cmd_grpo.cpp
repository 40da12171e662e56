// `trl grpo` and `trl rloo`: online RL with TRL's option names (GRPOConfig, RLOOConfig), from flags or a YAML
// config; the reward functions by name (--reward_funcs length:200 regex:... exec:"python3 score.py").
#include <cstdio>
#include <memory>
#include <optional>


#include "cli/cli_util.h"
#include "cli/embed.h"
#include "core/json_text.h"
#include "cli/train_options.h"
#include "trl/core/error.h"
#include "trl/train/grpo_trainer.h"

namespace trl::cli {

namespace {

template <class Config>
struct OnlineArgs {
  Config c;
  TrainCommandArgs t;
  std::string ref_model, reward_model, chat_template_kwargs, generation_kwargs, scale_rewards;
  std::vector<std::string> reward_funcs;
  std::vector<double> reward_clip_range;
  // Accepted for pasted TRL command lines; they change nothing here.
  bool use_vllm = false;
  std::string vllm_mode;
  std::optional<int64_t> max_prompt_length;
};

// The options GRPO and RLOO share.
template <class Config>
void add_online_options(Options& o, OnlineArgs<Config>& a) {
  Config& c = a.c;
  add_training_options(o, c, a.t);
  o.add("reward_funcs", a.reward_funcs,
        "Reward functions: length:N, accuracy_reward, think_format_reward, soft_overlong_punishment:MAX:CACHE, regex:PATTERN, exec:COMMAND")
      .default_text("none (required)");
  o.add("reward_model_name_or_path", a.reward_model, "A reward model (folder or local-cache id): the first reward function").default_text("None");
  o.add("reward_weights", c.reward_weights, "One weight per reward function").default_text("1 each");
  o.add("ref_model_name_or_path", a.ref_model, "The frozen reference model when beta > 0 (default: a copy of the starting model)").default_text("None");
  o.add("num_generations", c.num_generations, "Completions per prompt (a group)").min(2);
  o.add("max_completion_length", c.max_completion_length, "New tokens per completion at most").min(1);
  o.add("generation_batch_size", c.generation_batch_size, "Completions per generation round").min(1).default_text(
      "None (per_device_train_batch_size × steps_per_generation)");
  o.add("steps_per_generation", c.steps_per_generation, "Micro-batches each generation round is split into").min(1).default_text(
      "None (gradient_accumulation_steps)");
  o.add("num_iterations", c.num_iterations, "Optimizer passes over each generated batch").min(1);
  o.add("temperature", c.temperature, "Sampling temperature (also divides the logits of the loss)").above(0);
  o.add("top_p", c.top_p, "Nucleus sampling").above(0).max(1);
  o.add("top_k", c.top_k, "Top-k sampling (0: off)").min(0);
  o.add("min_p", c.min_p, "Min-p sampling").min(0).max(1).default_text("None");
  o.add("repetition_penalty", c.repetition_penalty, "Repetition penalty").above(0);
  o.add("epsilon", c.epsilon, "Clipping range of the ratio: [1 - epsilon, 1 + epsilon_high]").min(0);
  o.add("epsilon_high", c.epsilon_high, "Upper clipping range").min(0).default_text("None (epsilon)");
  o.add("beta", c.beta, "KL coefficient (0: no reference model)").min(0);
  o.add("router_aux_loss_coef", c.router_aux_loss_coef, "Weight of a mixture-of-experts model's load-balancing loss (0: off; no effect on a dense model)").min(0);
  o.add("mask_truncated_completions", c.mask_truncated_completions, "Leave completions without EOS out of the loss");
  o.add("shuffle_dataset", c.shuffle_dataset, "Shuffle the prompts every epoch");
  o.add("cache_implementation", c.cache_implementation, "static (dynamic is accepted and runs the static cache)").default_text("None (static)");
  o.add("pad_to_multiple_of", c.pad_to_multiple_of, "None | auto | N: the prompt and completion buckets (auto = the backend's, 64 on the CPU)");
  o.add("chat_template_kwargs", a.chat_template_kwargs, "JSON object of chat template variables, e.g. '{\"enable_thinking\": false}'")
      .default_text("{}")
      .json_object();
  o.add("generation_kwargs", a.generation_kwargs,
        "JSON object of generation settings over the ones above (do_sample, temperature, top_p, top_k, min_p, repetition_penalty)")
      .default_text("None")
      .json_object();
  o.add("log_completions", c.log_completions, "Print a sample of each round and write output_dir/completions.jsonl");
  o.add("num_completions_to_print", c.num_completions_to_print, "Rows printed per round with log_completions").min(0).default_text("4");
  o.add("reward_timeout_seconds", c.reward_timeout_seconds, "exec: rewards: the longest wait for one batch's answer").above(0);
  o.add("use_vllm", a.use_vllm, "Accepted; generation always uses trl.cpp's static-cache engine");
  o.add("vllm_mode", a.vllm_mode, "Accepted; ignored (no vLLM here)");
  o.add("max_prompt_length", a.max_prompt_length, "Accepted for older TRL configs; prompts are not truncated (as TRL now)").default_text("None");
}

template <class Config>
void finish_online(const char* command, OnlineArgs<Config>& a, Config& cfg) {
  finish_training_options(command, cfg, a.t);
  if (!a.chat_template_kwargs.empty()) {
    cfg.chat_template_kwargs = parse_json<nlohmann::ordered_json>(a.chat_template_kwargs, "--chat_template_kwargs '" + a.chat_template_kwargs + "'");
  }
  if (!a.generation_kwargs.empty() && a.generation_kwargs != "None")
    cfg.generation_kwargs = parse_json<nlohmann::ordered_json>(a.generation_kwargs, "--generation_kwargs '" + a.generation_kwargs + "'");
  if (a.reward_funcs.empty() && a.reward_model.empty())
    usage_fail("trl {}: --reward_funcs (or --reward_model_name_or_path) is required, e.g. --reward_funcs length:200", command);
  if (a.use_vllm) std::fprintf(stderr, "[trl] %s: use_vllm is ignored: completions come from trl.cpp's static-cache generator\n", command);
  if (a.max_prompt_length) std::fprintf(stderr, "[trl] %s: max_prompt_length is ignored: TRL no longer truncates prompts\n", command);
}

// As TRL's script: the reward model first, then --reward_funcs in order (a folder among them is a reward model too).
template <class Config>
std::vector<NamedRewardFunction> make_rewards(const OnlineArgs<Config>& a, const Config& c) {
  std::vector<std::string> specs = a.reward_funcs;
  if (!a.reward_model.empty() && a.reward_model != "None") specs.insert(specs.begin(), a.reward_model);
  std::vector<NamedRewardFunction> out;
  for (const std::string& s : specs) {
    if (s.rfind("python:", 0) == 0) {  // a Python callable the Python package passed (embed.h)
      const EmbeddedCall* call = embedded_call();
      const std::string index = s.substr(7);
      const bool digits = !index.empty() && index.size() < 6 && index.find_first_not_of("0123456789") == std::string::npos;
      if (call == nullptr || !digits || std::stoul(index) >= call->python_rewards.size())
        usage_fail("--reward_funcs {}: python: names a reward function passed from Python (the trl_cpp package), which this run has not got",
                   s);
      out.push_back(call->python_rewards[std::stoul(index)]);
      continue;
    }
    out.push_back(reward_from_spec(s, RewardFunctionOptions{c.reward_timeout_seconds}, c.bf16, c.chat_template_kwargs));
  }
  return out;
}

// Loads the run (model, tokenizer, prompts; the reference when beta > 0), trains and prints the summary line.
template <class Trainer, class Config>
void run_online(const char* command, const OnlineArgs<Config>& a, const Config& cfg, std::vector<NamedRewardFunction> rewards) {
  auto run = std::make_shared<RunWithReference>(RunWithReference{load_train_run(a.t, cfg), std::nullopt});
  if (cfg.beta != 0) run->ref = load_ref_model(a.ref_model, a.t, cfg);
  std::fprintf(stderr, "[trl] %s: %s on %s (%zu prompts), output %s\n", command, a.t.model.c_str(), a.t.dataset_label().c_str(), run->run.train.size(),
               cfg.output_dir.c_str());
  std::unique_ptr<PreparedTrainer> p = prepared<Trainer>(command, run, cfg.output_dir, run->run.model, run->run.tokenizer, std::move(rewards),
                                                         std::move(run->run.train), cfg, run->ref ? &*run->ref : nullptr);
  const auto* trainer = static_cast<const Trainer*>(p->trainer.get());
  p->generation_stats = [trainer] { return &trainer->generation_program_stats(); };
  deliver(std::move(p));
}

}  // namespace

void register_grpo(CLI::App& app) {
  auto* cmd = add_command(app, 
      "grpo", "Group Relative Policy Optimization (TRL's GRPOTrainer): trl grpo --model_name_or_path M --dataset_name prompts.jsonl --reward_funcs length:200");
  auto a = std::make_shared<OnlineArgs<GRPOConfig>>();
  auto o = std::make_shared<Options>(cmd);
  add_online_options(*o, *a);
  GRPOConfig& c = a->c;
  o->add("loss_type", c.loss_type, "grpo | bnpo | dr_grpo | dapo").choices({"grpo", "bnpo", "dr_grpo", "dapo"});
  o->add("scale_rewards", a->scale_rewards, "group | batch | none (true = group, false = none)").default_text("group");
  o->add("importance_sampling_level", c.importance_sampling_level, "token | sequence").choices({"token", "sequence"});
  o->add("delta", c.delta, "Two-sided clipping: cap of the unclipped ratio").default_text("None");
  o->add("multi_objective_aggregation", c.multi_objective_aggregation, "sum_then_normalize | normalize_then_sum")
      .choices({"sum_then_normalize", "normalize_then_sum"});
  on_run(cmd, [a, o] {
    if (!a->t.config.empty()) o->apply_yaml(a->t.config);
    GRPOConfig cfg = a->c;
    finish_online("grpo", *a, cfg);
    if (!a->scale_rewards.empty()) {
      const std::string& s = a->scale_rewards;
      cfg.scale_rewards = s == "true" || s == "True" ? "group" : s == "false" || s == "False" ? "none" : s;
    }
    std::vector<NamedRewardFunction> rewards = make_rewards(*a, cfg);
    check_config([&] { check_grpo_config(cfg, static_cast<int64_t>(rewards.size())); });  // before loading anything
    run_online<GRPOTrainer>("grpo", *a, cfg, std::move(rewards));
  });
}

void register_rloo(CLI::App& app) {
  auto* cmd = add_command(app, 
      "rloo", "REINFORCE Leave-One-Out (TRL's RLOOTrainer): trl rloo --model_name_or_path M --dataset_name prompts.jsonl --reward_funcs length:200");
  auto a = std::make_shared<OnlineArgs<RLOOConfig>>();
  auto o = std::make_shared<Options>(cmd);
  add_online_options(*o, *a);
  RLOOConfig& c = a->c;
  o->add("normalize_advantages", c.normalize_advantages, "Normalise the advantages over the batch");
  o->add("reward_clip_range", a->reward_clip_range, "Clip the summed reward to [LOW, HIGH] (two numbers)").default_text("None");
  on_run(cmd, [a, o] {
    if (!a->t.config.empty()) o->apply_yaml(a->t.config);
    RLOOConfig cfg = a->c;
    finish_online("rloo", *a, cfg);
    if (!a->reward_clip_range.empty()) {
      if (a->reward_clip_range.size() != 2) usage_fail("--reward_clip_range takes two numbers (low high), got {}", a->reward_clip_range.size());
      cfg.reward_clip_range = std::make_pair(a->reward_clip_range[0], a->reward_clip_range[1]);
    }
    std::vector<NamedRewardFunction> rewards = make_rewards(*a, cfg);
    check_config([&] { check_rloo_config(cfg, static_cast<int64_t>(rewards.size())); });
    run_online<RLOOTrainer>("rloo", *a, cfg, std::move(rewards));
  });
}

}  // namespace trl::cli

// `trl dpo`: Direct Preference Optimization with TRL's option names (DPOConfig), from flags or a YAML config.
#include <cstdio>
#include <optional>


#include "cli/cli_util.h"
#include "cli/embed.h"
#include "cli/train_options.h"
#include "trl/core/error.h"
#include "trl/train/dpo_trainer.h"

namespace trl::cli {

void register_dpo(CLI::App& app) {
  auto* cmd = add_command(app, 
      "dpo", "Direct Preference Optimization (TRL's DPOTrainer): trl dpo --model_name_or_path M --dataset_name pairs.jsonl");
  struct Args {
    DPOConfig c;
    TrainCommandArgs t;
    std::string ref_model;
  };
  auto a = std::make_shared<Args>();
  auto o = std::make_shared<Options>(cmd);
  DPOConfig& c = a->c;
  add_training_options(*o, c, a->t);
  o->add("ref_model_name_or_path", a->ref_model, "The frozen reference model (default: a copy of the starting model)").default_text("None");
  o->add("max_length", c.max_length, "Truncate each prompt + completion to this many tokens").min(2);
  o->add("truncation_mode", c.truncation_mode, "Which end of a long sequence is kept").choices({"keep_start", "keep_end"});
  o->add("padding_free", c.padding_free, "All sequences of a micro-batch in one row, no padding between them");
  o->add("pad_to_multiple_of", c.pad_to_multiple_of, "None | auto | N (auto = the backend's bucket, 64 on the CPU)");
  o->add("precompute_ref_log_probs", c.precompute_ref_log_probs, "Run the reference once before training, then release it");
  o->add("precompute_ref_batch_size", c.precompute_ref_batch_size, "Pairs per reference batch when precomputing").min(1).default_text(
      "None (per_device_train_batch_size)");
  o->add("loss_type", c.loss_type, "One or more DPO losses (sigmoid, hinge, ipo, robust, exo_pair, nca_pair, bco_pair, sppo_hard, aot, "
                                  "aot_unpaired, apo_zero, apo_down, discopop, sigmoid_norm, sft)");
  o->add("loss_weights", c.loss_weights, "One weight per loss_type").default_text("None (1 each)");
  o->add("beta", c.beta, "Temperature of the implicit reward").above(0);
  o->add("label_smoothing", c.label_smoothing, "Label smoothing (robust, exo_pair; conservative DPO)").min(0).max(0.5);
  o->add("f_divergence_type", c.f_divergence_type, "Divergence of the implicit reward")
      .choices({"reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"});
  o->add("f_alpha_divergence_coef", c.f_alpha_divergence_coef, "alpha of alpha_divergence");
  o->add("discopop_tau", c.discopop_tau, "Temperature of the discopop loss").above(0);
  o->add("ld_alpha", c.ld_alpha, "LD-DPO: weight of the completion tokens past the pair's shorter completion (0-1)").default_text("None");
  o->add("sync_ref_model", c.sync_ref_model, "TR-DPO: mix the policy into the reference every ref_model_sync_steps steps");
  o->add("ref_model_mixup_alpha", c.ref_model_mixup_alpha, "TR-DPO: reference = alpha * policy + (1 - alpha) * reference").min(0).max(1);
  o->add("ref_model_sync_steps", c.ref_model_sync_steps, "TR-DPO: optimizer steps between reference updates").min(1);
  o->add("router_aux_loss_coef", c.router_aux_loss_coef, "Weight of a mixture-of-experts model's load-balancing loss (0: off; no effect on a dense model)").min(0);
  o->add("eos_token", c.eos_token, "Appended to text completions; must be one token of the vocabulary").default_text("the tokenizer's");
  on_run(cmd, [a, o] {
    if (!a->t.config.empty()) o->apply_yaml(a->t.config);
    DPOConfig cfg = a->c;
    finish_training_options("dpo", cfg, a->t);
    check_config([&] { check_dpo_config(cfg); });  // before loading anything
    auto run = std::make_shared<RunWithReference>(RunWithReference{load_train_run(a->t, cfg), load_ref_model(a->ref_model, a->t, cfg)});
    std::fprintf(stderr, "[trl] dpo: %s on %s (%zu rows), output %s\n", a->t.model.c_str(), a->t.dataset_label().c_str(), run->run.train.size(),
                 cfg.output_dir.c_str());
    deliver(prepared<DPOTrainer>("dpo", run, cfg.output_dir, run->run.model, run->run.tokenizer, std::move(run->run.train), cfg, std::move(run->run.eval),
                                 run->ref ? &*run->ref : nullptr));
  });
}

}  // namespace trl::cli

// `trl kto`: Kahneman-Tversky Optimization with TRL's option names (KTOConfig), from flags or a YAML config.
#include <cstdio>
#include <optional>


#include "cli/cli_util.h"
#include "cli/embed.h"
#include "cli/train_options.h"
#include "trl/core/error.h"
#include "trl/train/kto_trainer.h"

namespace trl::cli {

void register_kto(CLI::App& app) {
  auto* cmd = add_command(app, 
      "kto", "Kahneman-Tversky Optimization (TRL's KTOTrainer): trl kto --model_name_or_path M --dataset_name rows.jsonl");
  struct Args {
    KTOConfig c;
    TrainCommandArgs t;
    std::string ref_model;
  };
  auto a = std::make_shared<Args>();
  auto o = std::make_shared<Options>(cmd);
  KTOConfig& c = a->c;
  add_training_options(*o, c, a->t);
  o->add("ref_model_name_or_path", a->ref_model, "The frozen reference model (default: a copy of the starting model)").default_text("None");
  o->add("max_length", c.max_length, "Truncate each prompt + completion to this many tokens (the start is kept)").min(2);
  o->add("pad_to_multiple_of", c.pad_to_multiple_of, "None | auto | N (auto = the backend's bucket, 64 on the CPU)");
  o->add("precompute_ref_log_probs", c.precompute_ref_log_probs, "Run the reference once before training, then release it");
  o->add("precompute_ref_batch_size", c.precompute_ref_batch_size, "Rows per reference batch when precomputing").min(1).default_text(
      "None (per_device_train_batch_size)");
  o->add("loss_type", c.loss_type, "kto | apo_zero_unpaired").choices({"kto", "apo_zero_unpaired"});
  o->add("beta", c.beta, "Temperature of the implicit reward").above(0);
  o->add("desirable_weight", c.desirable_weight, "Weight of the desirable rows' losses").above(0);
  o->add("undesirable_weight", c.undesirable_weight, "Weight of the undesirable rows' losses").above(0);
  o->add("router_aux_loss_coef", c.router_aux_loss_coef, "Weight of a mixture-of-experts model's load-balancing loss (0: off; no effect on a dense model)").min(0);
  o->add("eos_token", c.eos_token, "Appended to text completions; must be one token of the vocabulary").default_text("the tokenizer's");
  on_run(cmd, [a, o] {
    if (!a->t.config.empty()) o->apply_yaml(a->t.config);
    KTOConfig cfg = a->c;
    finish_training_options("kto", cfg, a->t);
    check_config([&] { check_kto_config(cfg); });  // before loading anything
    auto run = std::make_shared<RunWithReference>(RunWithReference{load_train_run(a->t, cfg), load_ref_model(a->ref_model, a->t, cfg)});
    std::fprintf(stderr, "[trl] kto: %s on %s (%zu rows), output %s\n", a->t.model.c_str(), a->t.dataset_label().c_str(), run->run.train.size(),
                 cfg.output_dir.c_str());
    deliver(prepared<KTOTrainer>("kto", run, cfg.output_dir, run->run.model, run->run.tokenizer, std::move(run->run.train), cfg, std::move(run->run.eval),
                                 run->ref ? &*run->ref : nullptr));
  });
}

}  // namespace trl::cli

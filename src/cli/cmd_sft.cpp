// `trl sft`: supervised fine-tuning with TRL's option names, from flags or a YAML config (`--config sft.yaml`, the
// same keys as the flags; flags given on the command line win).
#include <cstdio>


#include "cli/cli_util.h"
#include "cli/embed.h"
#include "cli/train_options.h"
#include "trl/core/error.h"
#include "trl/train/sft_trainer.h"

namespace trl::cli {

void register_sft(CLI::App& app) {
  auto* cmd = add_command(app, "sft", "Supervised fine-tuning (TRL's SFTTrainer): trl sft --model_name_or_path M --dataset_name data.jsonl");
  struct Args {
    SFTConfig c;
    TrainCommandArgs t;
    std::string packing_strategy = "bfd";
  };
  auto a = std::make_shared<Args>();
  auto o = std::make_shared<Options>(cmd);
  SFTConfig& c = a->c;
  add_training_options(*o, c, a->t);
  o->add("max_length", c.max_length, "Truncate (or pack) to this many tokens").min(1);
  o->add("packing", c.packing, "Pack examples into rows of max_length (best-fit decreasing)");
  o->add("packing_strategy", a->packing_strategy, "How packing fills rows: bfd (best-fit decreasing, overflow truncated)")
      .choices({"bfd", "bfd_split", "wrapped"});
  o->add("padding_free", c.padding_free, "One row per micro-batch, no padding between examples");
  o->add("completion_only_loss", c.completion_only_loss, "Loss on completions only (None: yes for prompt-completion data)");
  o->add("assistant_only_loss", c.assistant_only_loss, "Loss on assistant turns only");
  o->add("pad_to_multiple_of", c.pad_to_multiple_of, "None | auto | N (auto = the backend's bucket, 64 on the CPU)");
  o->add("dataset_text_field", c.dataset_text_field, "Field of language-modelling rows");
  o->add("router_aux_loss_coef", c.router_aux_loss_coef, "Weight of a mixture-of-experts model's load-balancing loss (0: off; no effect on a dense model)").min(0);
  o->add("eos_token", c.eos_token, "Appended to non-chat text; must be one token of the vocabulary").default_text("the tokenizer's");
  on_run(cmd, [a, o] {
    if (!a->t.config.empty()) o->apply_yaml(a->t.config);
    if (a->packing_strategy != "bfd")
      usage_fail("--packing_strategy {}: trl.cpp packs with bfd only (best-fit decreasing, each example truncated to max_length, no "
                 "attention across examples); drop the option or give bfd", a->packing_strategy);
    SFTConfig cfg = a->c;
    finish_training_options("sft", cfg, a->t);
    check_config([&] { check_sft_config(cfg); });  // before loading anything: a bad option fails at once (eos_token is checked with the tokenizer)
    auto run = std::make_shared<TrainRun>(load_train_run(a->t, cfg));
    std::fprintf(stderr, "[trl] sft: %s on %s (%zu rows), output %s\n", a->t.model.c_str(), a->t.dataset_label().c_str(), run->train.size(), cfg.output_dir.c_str());
    deliver(prepared<SFTTrainer>("sft", run, cfg.output_dir, run->model, run->tokenizer, std::move(run->train), cfg, std::move(run->eval)));
  });
}

}  // namespace trl::cli

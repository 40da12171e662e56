// `trl reward`: reward-model training with TRL's option names (RewardConfig), from flags or a YAML config. The
// model is a causal LM (a new score head) or a saved reward model; the output is a sequence-classification folder.
#include <cstdio>


#include "cli/cli_util.h"
#include "cli/embed.h"
#include "cli/train_options.h"
#include "trl/core/error.h"
#include "trl/models/reward_model.h"
#include "trl/train/reward_trainer.h"

namespace trl::cli {

void register_reward(CLI::App& app) {
  auto* cmd = add_command(app, "reward", "Reward-model training (TRL's RewardTrainer): trl reward --model_name_or_path M --dataset_name pairs.jsonl");
  struct Args {
    RewardConfig c;
    TrainCommandArgs t;
    std::optional<double> center;
  };
  auto a = std::make_shared<Args>();
  auto o = std::make_shared<Options>(cmd);
  RewardConfig& c = a->c;
  add_training_options(*o, c, a->t);
  o->add("max_length", c.max_length, "Pairs whose chosen or rejected sequence is longer are dropped").min(2);
  o->add("pad_to_multiple_of", c.pad_to_multiple_of, "None | auto | N (auto = the backend's bucket, 64 on the CPU)");
  o->add("center_rewards_coefficient", a->center, "Weight of the mean squared reward (centring; None: off)").min(0).default_text("None");
  o->add("eos_token", c.eos_token, "Appended to text completions; must be one token of the vocabulary").default_text("the tokenizer's");
  on_run(cmd, [a, o] {
    if (!a->t.config.empty()) o->apply_yaml(a->t.config);
    RewardConfig cfg = a->c;
    cfg.center_rewards_coefficient = a->center;
    finish_training_options("reward", cfg, a->t);
    check_config([&] { check_reward_config(cfg); });  // before loading anything
    struct Held {
      Tokenizer tok;
      std::optional<RewardModel> model;
    };
    auto held = std::make_shared<Held>(Held{Tokenizer::from_pretrained(a->t.model, a->t.revision), std::nullopt});
    const Tokenizer& tok = held->tok;
    const auto pad = tok.pad_token_id();
    if (!pad) fail("trl reward: the tokenizer of {} has neither a pad_token nor an eos_token (the reward is read at the last non-pad token)", a->t.model);
    LoadOptions lo;
    lo.revision = a->t.revision;
    if (a->t.dtype != "auto") lo.dtype = (a->t.dtype == "bf16" || a->t.dtype == "bfloat16") ? DType::BF16 : DType::F32;
    lo.device = a->t.device;
    const RewardModel& model = held->model.emplace(load_reward_model(a->t.model, lo, *pad, cfg.seed));
    auto [train, eval] = load_train_data(a->t, cfg);
    std::fprintf(stderr, "[trl] reward: %s (%s) on %s (%zu rows), output %s\n", a->t.model.c_str(), model.new_head ? "a new score head" : "its score head",
                 a->t.dataset_label().c_str(), train.size(), cfg.output_dir.c_str());
    deliver(prepared<RewardTrainer>("reward", held, cfg.output_dir, model, tok, std::move(train), cfg, std::move(eval)));
  });
}

}  // namespace trl::cli

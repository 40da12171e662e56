// Every trainer with a LoRA adapter (--use_peft, docs/LORA.md) on the tiny model: DPO's and KTO's reference is the
// base with the adapter disabled (so the first DPO loss is log 2 and the first KTO loss 1/2, as B = 0 at
// initialisation), a reward model trains its score head in full beside the adapter and saves it with it, GRPO
// trains an adapter, a resumed LoRA run (dropout on) equals an uninterrupted one, and the tiny model learns the SFT
// and DPO tasks with adapters only.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "assets/assets.h"
#include "core/fs.h"
#include "test_util.h"
#include "trl/backend/registry.h"
#include "trl/generation/generate.h"
#include "trl/models/lora.h"
#include "trl/models/init.h"
#include "trl/models/reward_model.h"
#include "trl/train/dpo_trainer.h"
#include "trl/train/grpo_trainer.h"
#include "trl/train/kto_trainer.h"
#include "trl/train/reward_trainer.h"
#include "trl/train/rewards.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;
using test::kSanitized;

Dataset repeat_pairs(int n) {
  static const char* words[] = {"apple", "river", "stone", "cloud", "green", "tiger", "piano", "light", "ocean", "bread", "chair", "music"};
  Dataset d;
  for (int i = 0; i < n; ++i) {
    const std::string w = words[i % 12], other = words[(i + 5) % 12];
    d.rows.push_back(ojson{{"prompt", "Repeat the word " + w + ":"}, {"chosen", " " + w}, {"rejected", " " + other}});
    d.where.push_back("pairs.jsonl:" + std::to_string(i + 1));
  }
  return d;
}

LoraConfig lora(std::vector<std::string> targets = {"all-linear"}) {
  LoraConfig c;
  c.r = 16;
  c.lora_alpha = 32;
  c.lora_dropout = 0.05;
  c.target_modules = std::move(targets);
  return c;
}

template <class Config>
Config base_config(const std::string& out) {
  Config c;
  c.output_dir = out;
  c.bf16 = false;
  c.learning_rate = 1e-3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  c.peft_config = lora();
  return c;
}

double first_loss(const TrainOutput& o) {
  const double v = o.log_history.front().at("loss").get<double>();
  EXPECT_TRUE(std::isfinite(v));
  return v;
}

TEST(LoraTrainers, DpoAndKtoReferenceIsTheBaseWithTheAdapterDisabled) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  {
    DPOConfig c = base_config<DPOConfig>(t.dir.file("dpo"));
    c.per_device_train_batch_size = 4;
    c.max_steps = 3;
    DPOTrainer tr(t.model, tok, repeat_pairs(4), c);
    const TrainOutput o = tr.train();
    // B = 0: the policy is the reference at step 1, so every reward is 0 and the loss is log 2; then it moves.
    EXPECT_NEAR(first_loss(o), std::log(2.0), 1e-6);
    EXPECT_NEAR(o.log_history.front().at("rewards/margins").get<double>(), 0.0, 1e-6);
    EXPECT_GT(std::fabs(o.log_history.back().at("rewards/margins").get<double>()), 1e-6);
    EXPECT_TRUE(load_adapter(c.output_dir, t.model.config()).weights.size() == 2u * 7 * 2);
    // sync_ref_model needs reference weights of its own: refused with an adapter.
    c.sync_ref_model = true;
    EXPECT_NE(test::error_of([&] { DPOTrainer bad(t.model, tok, repeat_pairs(4), c); }).find("sync_ref_model"), std::string::npos);
  }
  {
    KTOConfig c = base_config<KTOConfig>(t.dir.file("kto"));
    c.per_device_train_batch_size = 4;
    c.max_steps = 2;
    KTOTrainer tr(t.model, tok, repeat_pairs(4), c);
    const TrainOutput o = tr.train();
    EXPECT_NEAR(first_loss(o), 0.5, 1e-6);  // 1 − σ(0) for every example while policy = reference
  }
}

TEST(LoraTrainers, RewardModelTrainsItsHeadInFullAndSavesItWithTheAdapter) {
  test::TinyModel t;
  const int32_t pad = *test::qwen3_tokenizer().pad_token_id();
  const RewardModel start{t.model, new_score_head(t.model.config(), t.model.dtype(), 7), pad, true};
  RewardConfig c = base_config<RewardConfig>(t.dir.file("rm"));
  c.per_device_train_batch_size = 4;
  c.max_steps = 2;
  RewardTrainer tr(start, test::qwen3_tokenizer(), repeat_pairs(4), c);
  EXPECT_TRUE(tr.master_weights().count("score.weight"));
  EXPECT_FALSE(tr.master_weights().count("model.embed_tokens.weight"));
  tr.train();
  const ojson config = ojson::parse(read_text_file(c.output_dir + "/adapter_config.json"));
  EXPECT_EQ(config["task_type"], "SEQ_CLS");
  EXPECT_EQ(config["modules_to_save"], ojson({"score"}));
  const LoraAdapter a = load_adapter(c.output_dir, t.model.config());
  ASSERT_TRUE(a.weights.count("score.weight"));
  EXPECT_NE(a.weights.at("score.weight").to_f32_vector(), start.score.to_f32_vector());  // trained
  // The adapter folder is a reward model (trl score, GRPO's reward_funcs): its base with the adapter merged, and
  // the saved head; its rewards are those of the unmerged adapter with that head.
  ASSERT_TRUE(is_sequence_classification_adapter(c.output_dir));
  const RewardModel loaded = load_reward_model(c.output_dir);
  EXPECT_EQ(loaded.backbone.lora(), nullptr);
  const RewardModel unmerged{t.model.with_adapter(a), a.weights.at("score.weight"), pad, false};
  auto backend = make_backend("cpu");
  const std::vector<std::vector<int32_t>> seqs = {{785, 8585, 49041, 7506}, {151644, 872, 198}};
  const std::vector<double> x = reward_scores(loaded, seqs, *backend), y = reward_scores(unmerged, seqs, *backend);
  ASSERT_EQ(x.size(), 2u);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-4 * std::max(1.0, std::fabs(y[i]))) << i;
}

TEST(LoraTrainers, GrpoTrainsAnAdapter) {
  test::TinyModel t;
  GRPOConfig c = base_config<GRPOConfig>(t.dir.file("grpo"));
  c.per_device_train_batch_size = 4;
  c.num_generations = 4;
  c.max_completion_length = 8;
  c.max_steps = 2;
  c.pad_to_multiple_of = "32";
  c.beta = 0.04;  // a reference model: the base with the adapter disabled
  Dataset d;
  for (int i = 0; i < 2; ++i) d.rows.push_back(ojson{{"prompt", "Say a word."}}), d.where.push_back("p:" + std::to_string(i));
  GRPOTrainer tr(t.model, test::qwen3_tokenizer(), {reward_function("length:20")}, d, c);
  const TrainOutput o = tr.train();
  EXPECT_EQ(o.global_step, 2);
  EXPECT_NEAR(o.log_history.front().at("kl").get<double>(), 0.0, 1e-6);  // policy = reference at step 1
  EXPECT_TRUE(std::filesystem::exists(c.output_dir + "/adapter_model.safetensors"));
}

// 4 steps at once == 2 steps, a checkpoint, and 2 resumed steps: the adapter, its moments and the dropout masks
// (seeded by step and micro-batch) continue exactly.
TEST(LoraTrainers, ResumedRunWithDropoutEqualsAnUninterruptedOne) {
  test::TinyModel t;
  test::write_file(t.dir.file("chat.jsonl"), std::string(asset("demo/chat.jsonl")));
  const Dataset data = load_dataset(t.dir.file("chat.jsonl"));
  auto config = [&](const std::string& out) {
    SFTConfig c = base_config<SFTConfig>(t.dir.file(out));
    c.per_device_train_batch_size = 2;
    c.gradient_accumulation_steps = 2;
    c.max_steps = 4;
    c.save_steps = 2;
    c.learning_rate = 1e-2;
    c.lr_scheduler_type = "constant";  // the first run stops at step 2: the same schedule as the 4-step run's
    return c;
  };
  SFTTrainer straight(t.model, test::qwen3_tokenizer(), data, config("a"));
  const TrainOutput a = straight.train();
  SFTConfig c = config("b");
  c.max_steps = 2;
  SFTTrainer first(t.model, test::qwen3_tokenizer(), data, c);
  first.train();
  c.max_steps = 4;
  c.resume_from_checkpoint = t.dir.file("b/checkpoint-2");
  SFTTrainer resumed(t.model, test::qwen3_tokenizer(), data, c);
  const TrainOutput b = resumed.train();
  ASSERT_EQ(a.log_history.size(), b.log_history.size());
  for (size_t i = 0; i < a.log_history.size(); ++i) EXPECT_EQ(a.log_history[i]["loss"], b.log_history[i]["loss"]) << "step " << i + 1;
  for (const auto& [name, w] : straight.master_weights()) EXPECT_EQ(w.to_f32_vector(), resumed.master_weights().at(name).to_f32_vector()) << name;
  // Dropout is on: another seed gives other masks, so other losses.
  SFTConfig other = config("c");
  other.seed = 43;
  other.max_steps = 1;
  SFTTrainer seeded(t.model, test::qwen3_tokenizer(), data, other);
  EXPECT_NE(seeded.train().log_history.front()["loss"], a.log_history.front()["loss"]);
}

// Learning with adapters only: the demo answers (SFT) and the rule of the preference pairs (DPO).
TEST(LoraTrainers, TinyModelLearnsSftAndDpoTasksWithAdaptersOnly) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  const Tokenizer& tok = test::cut_tokenizer();
  test::TempDir dir;
  InitOptions io;
  io.preset = "tiny";
  io.vocab_size = test::kCutVocab;
  io.initializer_range = 0.1;  // logits with some range: the frozen random embeddings are the output head
  init_model(io, dir.file("base"));
  const CausalLM model = CausalLM::from_pretrained(dir.file("base"));
  test::write_file(dir.file("chat.jsonl"), std::string(asset("demo/chat.jsonl")));
  Dataset ds = load_dataset(dir.file("chat.jsonl"));
  ds.rows.resize(8);
  ds.where.resize(8);
  // The tiny model's tied embeddings are random and frozen, and its final norm fixes |h|: its logits sharpen slowly
  // through the decoder's adapters alone, so the final norm is trained in full too (modules_to_save), which a
  // pretrained model would not need.
  SFTConfig c = base_config<SFTConfig>(dir.file("sft"));
  c.peft_config->modules_to_save = {"model.norm"};
  c.bf16 = true;
  c.learning_rate = 2e-2;
  c.lr_scheduler_type = "constant_with_warmup";
  c.warmup_steps = 5;
  c.per_device_train_batch_size = 8;
  c.max_steps = 100;
  c.logging_steps = 10;
  SFTTrainer sft(model, tok, ds, c);
  const TrainOutput out = sft.train();
  const double first = out.log_history.front()["loss"].get<double>(), last = out.log_history.back()["loss"].get<double>();
  const CausalLM tuned = CausalLM::from_pretrained(c.output_dir);  // the adapter folder: base + adapter
  ASSERT_NE(tuned.lora(), nullptr);
  const CausalLM merged = tuned.merged();  // the Generator keeps a reference
  Generator gen(merged);
  int right = 0;
  for (const ChatAnswer& a : greedy_chat_answers(gen, tok, ds.rows, 10)) right += a.exact;
  std::printf("[ learning ] lora sft: loss %.3f -> %.3f, %d of 8 answers exact\n", first, last, right);
  EXPECT_LT(last, 0.1 * first);
  EXPECT_GE(right, 7);

  DPOConfig d = base_config<DPOConfig>(dir.file("dpo"));
  d.peft_config->modules_to_save = {"model.norm"};
  d.bf16 = true;
  d.learning_rate = 5e-3;
  d.per_device_train_batch_size = 4;
  d.max_steps = 30;
  d.logging_steps = 5;
  d.eval_strategy = "steps";
  d.eval_steps = 30;
  const Dataset pairs = repeat_pairs(12);
  DPOTrainer dpo(model, tok, pairs, d, pairs);
  const TrainOutput o = dpo.train();
  const ojson& eval = o.log_history.back();
  std::printf("[ learning ] lora dpo: loss %.3f -> %.3f, eval_rewards/accuracies %.2f\n", o.log_history.front()["loss"].get<double>(),
              o.log_history.at(o.log_history.size() - 2)["loss"].get<double>(), eval["eval_rewards/accuracies"].get<double>());
  EXPECT_GT(eval["eval_rewards/accuracies"].get<double>(), 0.9);
  EXPECT_LT(eval["eval_loss"].get<double>(), 0.5 * std::log(2.0));
}

}  // namespace
}  // namespace trl

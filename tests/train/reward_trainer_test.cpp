// RewardTrainer on the tiny model: 4 micro-batches of 1 pair == 1 batch of 4; the saved folder is a
// sequence-classification checkpoint that loads back with its head (and scores as the trainer does); a checkpoint
// with two labels is refused; a rule is learned (held-out pairs ranked right); bad rows name where they are.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/io/safetensors.h"
#include "trl/models/reward_model.h"
#include "trl/train/reward_trainer.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

using test::kSanitized;

const char* kWords[] = {"apple", "river", "stone", "cloud", "green", "tiger", "piano", "light", "ocean", "bread", "chair", "music", "lemon", "glass"};

// The chosen answer repeats the prompt's word; the rejected one says the word `shift` places later.
Dataset repeat_pairs(int n, int shift, bool margins = false) {
  Dataset d;
  for (int i = 0; i < n; ++i) {
    const std::string w = kWords[i % 14], other = kWords[(i + shift) % 14];
    ojson row{{"prompt", "Repeat the word " + w + ":"}, {"chosen", " " + w}, {"rejected", " " + other}};
    if (margins) row["margin"] = 0.5;
    d.rows.push_back(row);
    d.where.push_back("pairs.jsonl:" + std::to_string(i + 1));
  }
  return d;
}

RewardConfig base_config(const std::string& out) {
  RewardConfig c;
  c.output_dir = out;
  c.bf16 = false;
  c.learning_rate = 1e-3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  c.max_grad_norm = 0;
  return c;
}

RewardModel tiny_reward_model(const test::TinyModel& t) {
  const int32_t pad = *test::qwen3_tokenizer().pad_token_id();
  return RewardModel{t.model, new_score_head(t.model.config(), t.model.dtype(), 7), pad, true};
}

TEST(RewardTrainer, AccumulationEqualsOneLargeBatchAndTheSavedFolderLoadsBack) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  const RewardModel start = tiny_reward_model(t);
  RewardConfig a = base_config(t.dir.file("a"));
  a.adam_epsilon = 1.0;  // the first Adam update is ~lr·g: compares the gradients themselves
  a.per_device_train_batch_size = 4;
  a.max_steps = 1;
  RewardConfig b = a;
  b.output_dir = t.dir.file("b");
  b.per_device_train_batch_size = 1;
  b.gradient_accumulation_steps = 4;
  RewardTrainer ta(start, tok, repeat_pairs(4, 5, true), a), tb(start, tok, repeat_pairs(4, 5, true), b);
  const TrainOutput oa = ta.train(), ob = tb.train();
  const double la = oa.log_history[0]["loss"].get<double>(), lb = ob.log_history[0]["loss"].get<double>();
  ASSERT_TRUE(std::isfinite(la) && std::isfinite(lb));
  EXPECT_NEAR(la, lb, 1e-5);
  EXPECT_NEAR(oa.log_history[0]["grad_norm"].get<double>(), ob.log_history[0]["grad_norm"].get<double>(), 1e-4 * oa.log_history[0]["grad_norm"].get<double>());
  for (const char* key : {"min_reward", "mean_reward", "max_reward", "accuracy", "margin", "num_tokens"})
    EXPECT_TRUE(oa.log_history[0].contains(key)) << key;
  ASSERT_TRUE(ta.master_weights().count("score.weight"));
  EXPECT_FALSE(ta.master_weights().count("lm_head.weight"));
  // The saved folder: Qwen3ForSequenceClassification with one label and the pad token; the trained head.
  const ojson config = ojson::parse(test::read_file(t.dir.file("a/config.json")));
  EXPECT_EQ(config["architectures"][0], "Qwen3ForSequenceClassification");
  EXPECT_EQ(config["id2label"].size(), 1u);
  EXPECT_EQ(config["pad_token_id"], start.pad_token_id);
  const Checkpoint ck = Checkpoint::open(t.dir.file("a"));
  EXPECT_TRUE(ck.contains("score.weight"));
  EXPECT_FALSE(ck.contains("lm_head.weight"));
  const RewardModel back = load_reward_model(t.dir.file("a"));
  EXPECT_FALSE(back.new_head);
  EXPECT_EQ(back.pad_token_id, start.pad_token_id);
  EXPECT_EQ(back.score.to_f32_vector(), ta.master_weights().at("score.weight").to_f32_vector());
  // trl score's rewards of the pairs rank them as the trainer's metrics say, and do not depend on the batching.
  auto backend = make_backend("cpu");
  const std::vector<std::vector<int32_t>> seqs = {tok.encode("Repeat the word apple: apple<|im_end|>", true),
                                                   tok.encode("Repeat the word apple: tiger<|im_end|>", true)};
  const std::vector<double> together = reward_scores(back, seqs, *backend, 2), alone = reward_scores(back, {seqs[1]}, *backend, 1);
  ASSERT_EQ(together.size(), 2u);
  EXPECT_TRUE(std::isfinite(together[0]) && std::isfinite(together[1]));
  EXPECT_NEAR(together[1], alone[0], 1e-5);
}

TEST(RewardTrainer, LoadingRefusesTwoLabelsAndRowsMustAgreeOnMargins) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  RewardTrainer tr(tiny_reward_model(t), tok, repeat_pairs(2, 5), [&] {
    RewardConfig c = base_config(t.dir.file("o"));
    c.max_steps = 1;
    return c;
  }());
  tr.train();
  ojson config = ojson::parse(test::read_file(t.dir.file("o/config.json")));
  config["id2label"] = {{"0", "LABEL_0"}, {"1", "LABEL_1"}};
  test::write_file(t.dir.file("o/config.json"), config.dump(2));
  try {
    load_reward_model(t.dir.file("o"));
    ADD_FAILURE() << "two labels: no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("config.json: field 'id2label' has 2 labels"), std::string::npos) << m;
  }
  Dataset d = repeat_pairs(3, 5, true);
  d.rows[2].erase("margin");
  try {
    RewardTrainer(tiny_reward_model(t), tok, d, base_config(t.dir.file("p")));
    ADD_FAILURE() << "a row without margin: no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pairs.jsonl:3: \"margin\" must be in every row or in none"), std::string::npos) << e.what();
  }
  d.rows[2]["margin"] = "big";
  try {
    RewardTrainer(tiny_reward_model(t), tok, d, base_config(t.dir.file("p")));
    ADD_FAILURE() << "a string margin: no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pairs.jsonl:3: \"margin\" must be a number"), std::string::npos) << e.what();
  }
}

// Polite answers: the chosen one agrees in a full sentence, the rejected one is curt.
Dataset polite_pairs(int first, int last) {
  Dataset d;
  for (int i = first; i < last; ++i) {
    const std::string w = kWords[i];
    d.rows.push_back(ojson{{"prompt", "Can you bring me the " + w + "?"}, {"chosen", " Yes, of course, here is the " + w + "."}, {"rejected", " No."}});
    d.rows.push_back(ojson{{"prompt", "Please describe the " + w + "."}, {"chosen", " Gladly: the " + w + " is lovely."}, {"rejected", " Whatever."}});
    d.where.push_back("polite.jsonl:" + std::to_string(2 * (i - first) + 1));
    d.where.push_back("polite.jsonl:" + std::to_string(2 * (i - first) + 2));
  }
  return d;
}

// Learning: trained on pairs about 10 words (polite answers chosen over curt ones), the reward model ranks the
// pairs about 4 words it never saw right.
TEST(RewardTrainer, TinyModelRanksHeldOutPairs) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  RewardConfig c = base_config(t.dir.file("learn"));
  c.bf16 = true;
  c.learning_rate = 3e-3;
  c.per_device_train_batch_size = 4;
  c.max_steps = 30;
  c.logging_steps = 5;
  c.max_grad_norm = 1.0;
  c.eval_strategy = "steps";
  c.eval_steps = 30;
  RewardTrainer tr(tiny_reward_model(t), tok, polite_pairs(0, 10), c, polite_pairs(10, 14));
  const TrainOutput o = tr.train();
  const ojson& eval = o.log_history.back();
  std::printf("[ learning ] reward: loss %.3f -> %.3f, train accuracy %.2f, held-out accuracy %.2f\n", o.log_history.front()["loss"].get<double>(),
              o.log_history[o.log_history.size() - 2]["loss"].get<double>(), o.log_history[o.log_history.size() - 2]["accuracy"].get<double>(),
              eval["eval_accuracy"].get<double>());
  EXPECT_GT(eval["eval_accuracy"].get<double>(), 0.9);
}

}  // namespace
}  // namespace trl

// DPOTrainer on the tiny model: the first sigmoid loss is log 2; 4 micro-batches of 1 pair == 1 batch of 4;
// precomputed reference log-probs == a live reference; padded == padding-free; resume is exact; a rule the chosen
// answers follow is learned (rewards/accuracies > 0.9); bad options and rows are errors that name them.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/core/error.h"
#include "trl/train/dpo_trainer.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

using test::kSanitized;

// Pairs of a rule: the chosen answer repeats the prompt's word, the rejected one says another word.
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

DPOConfig base_config(const std::string& out) {
  DPOConfig c;
  c.output_dir = out;
  c.bf16 = false;
  c.learning_rate = 1e-3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  c.max_grad_norm = 0;  // compare raw updates
  return c;
}

double logged(const TrainOutput& o, size_t entry, const char* key) {
  const double v = o.log_history.at(entry).at(key).get<double>();
  EXPECT_TRUE(std::isfinite(v)) << key << " at log entry " << entry;
  return v;
}

// The largest |a - b| over every parameter, and the largest step |a - w0|; NaN anywhere gives NaN.
std::pair<double, double> weight_gap(const TensorMap& a, const TensorMap& b, const TensorMap& start) {
  double worst = 0, scale = 0;
  for (const auto& [name, w] : a) {
    const auto x = w.to_f32_vector(), y = b.at(name).to_f32_vector(), w0 = start.at(name).to_f32_vector();
    for (size_t i = 0; i < x.size(); ++i) {
      const double gap = std::fabs(static_cast<double>(x[i]) - y[i]), step = std::fabs(static_cast<double>(x[i]) - w0[i]);
      if (!(gap <= worst)) worst = gap;  // NaN-propagating max
      if (!(step <= scale)) scale = step;
    }
  }
  return {worst, scale};
}

TEST(DPOTrainer, FirstLossIsLog2AndAccumulationEqualsOneLargeBatch) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  DPOConfig a = base_config(t.dir.file("a"));
  a.adam_epsilon = 1.0;  // the first Adam update is ~lr·g: compares the gradients themselves
  a.per_device_train_batch_size = 4;
  a.max_steps = 1;
  DPOConfig b = a;
  b.output_dir = t.dir.file("b");
  b.per_device_train_batch_size = 1;
  b.gradient_accumulation_steps = 4;
  DPOTrainer ta(t.model, tok, repeat_pairs(4), a), tb(t.model, tok, repeat_pairs(4), b);
  const TrainOutput oa = ta.train(), ob = tb.train();
  EXPECT_NEAR(logged(oa, 0, "loss"), std::log(2.0), 1e-5);  // the policy starts as the reference: every margin is 0
  EXPECT_NEAR(logged(ob, 0, "loss"), std::log(2.0), 1e-5);
  EXPECT_NEAR(logged(oa, 0, "rewards/margins"), 0.0, 1e-5);
  EXPECT_NEAR(logged(oa, 0, "logps/chosen"), logged(ob, 0, "logps/chosen"), 1e-4);
  EXPECT_NEAR(logged(oa, 0, "grad_norm"), logged(ob, 0, "grad_norm"), 1e-4 * logged(oa, 0, "grad_norm"));
  const auto [worst, scale] = weight_gap(ta.master_weights(), tb.master_weights(), t.model.weights());
  EXPECT_GT(scale, 1e-7);  // the step moved the weights
  EXPECT_LE(worst, 1e-3 * scale);
  for (const char* key : {"entropy", "mean_token_accuracy", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "logps/rejected", "num_tokens"})
    EXPECT_TRUE(oa.log_history[0].contains(key)) << key;
}

// precompute_ref_log_probs gives the losses of a live reference; padding_free, rows padded to the longest
// (pad_to_multiple_of None) and rows padded to buckets of 16 give those of the backend's buckets (64).
TEST(DPOTrainer, PrecomputedReferenceAndPaddingFreeGiveTheSameLosses) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  DPOConfig live = base_config(t.dir.file("live"));
  live.per_device_train_batch_size = 2;
  live.max_steps = 3;
  DPOConfig pre = live, free = live;
  pre.output_dir = t.dir.file("pre");
  pre.precompute_ref_log_probs = true;
  free.output_dir = t.dir.file("free");
  free.padding_free = true;
  DPOConfig longest = live, b16 = live;
  longest.output_dir = t.dir.file("longest");
  longest.pad_to_multiple_of = "None";
  b16.output_dir = t.dir.file("b16");
  b16.pad_to_multiple_of = "16";
  DPOTrainer tl(t.model, tok, repeat_pairs(6), live), tp(t.model, tok, repeat_pairs(6), pre), tf(t.model, tok, repeat_pairs(6), free);
  DPOTrainer tn(t.model, tok, repeat_pairs(6), longest), t16(t.model, tok, repeat_pairs(6), b16);
  const TrainOutput ol = tl.train(), op = tp.train(), of = tf.train(), on = tn.train(), o16 = t16.train();
  ASSERT_EQ(ol.log_history.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(logged(op, s, "loss"), logged(ol, s, "loss"), 1e-6) << "step " << s + 1;
    for (const auto& [o, what] : {std::pair{&of, "padding_free"}, std::pair{&on, "padded to the longest"}, std::pair{&o16, "buckets of 16"}})
      for (const char* key : {"loss", "rewards/margins", "logps/chosen", "logits/rejected", "entropy"})
        EXPECT_NEAR(logged(*o, s, key), logged(ol, s, key), 1e-4 * std::max(1.0, std::fabs(logged(ol, s, key))))
            << what << " step " << s + 1 << " " << key;
  }
  EXPECT_GT(std::fabs(logged(ol, 2, "loss") - std::log(2.0)), 1e-4);  // the policy moved away from the reference
}

// Train 4 steps; or 2, stop (Ctrl-C), then resume from checkpoint-2 for 2 more: the same losses and weights, bit for bit.
TEST(DPOTrainer, ResumeIsExactAndAChangedBatchLayoutIsRefused) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  DPOConfig c = base_config(t.dir.file("full"));
  c.per_device_train_batch_size = 2;
  c.max_steps = 4;
  DPOTrainer full(t.model, tok, repeat_pairs(6), c);
  const TrainOutput of = full.train();
  DPOConfig h = c;
  h.output_dir = t.dir.file("half");
  h.save_steps = 2;
  {
    DPOTrainer tr(t.model, tok, repeat_pairs(6), h);
    int steps = 0;
    tr.on_step = [&](const ojson&) {
      if (++steps == 2) ::raise(SIGINT);  // Ctrl-C after step 2: checkpoint-2 is saved, training stops
    };
    EXPECT_TRUE(tr.train().interrupted);
  }
  h.resume_from_checkpoint = t.dir.file("half/checkpoint-2");
  DPOTrainer resumed(t.model, tok, repeat_pairs(6), h);
  const TrainOutput orr = resumed.train();
  ASSERT_EQ(orr.log_history.size(), 4u);
  for (size_t s = 0; s < 4; ++s) EXPECT_EQ(logged(orr, s, "loss"), logged(of, s, "loss")) << "step " << s + 1;
  for (const auto& [name, w] : full.master_weights()) EXPECT_EQ(w.to_f32_vector(), resumed.master_weights().at(name).to_f32_vector()) << name;
  h.per_device_train_batch_size = 3;
  try {
    DPOTrainer(t.model, tok, repeat_pairs(6), h).train();
    ADD_FAILURE() << "resuming with another batch size: no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("per_device_train_batch_size = 2"), std::string::npos) << m;
    EXPECT_NE(m.find("checkpoint-2"), std::string::npos) << m;
  }
}

// Learning: the chosen answers repeat the prompt's word; after training the policy prefers them on every pair.
TEST(DPOTrainer, TinyModelLearnsWhichAnswerFollowsTheRule) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  DPOConfig c = base_config(t.dir.file("learn"));
  c.bf16 = true;
  c.learning_rate = 5e-3;
  c.beta = 0.1;
  c.per_device_train_batch_size = 4;
  c.max_steps = 30;
  c.logging_steps = 5;
  c.max_grad_norm = 1.0;
  c.eval_strategy = "steps";
  c.eval_steps = 30;
  Dataset train = repeat_pairs(12);
  DPOTrainer tr(t.model, tok, train, c, train);
  const TrainOutput o = tr.train();
  const ojson& last = o.log_history.at(o.log_history.size() - 2);  // the last training entry (the eval entry follows)
  const ojson& eval = o.log_history.back();
  std::printf("[ learning ] dpo: loss %.3f -> %.3f, rewards/accuracies %.2f, eval_rewards/accuracies %.2f, margin %.3f\n",
              o.log_history.front()["loss"].get<double>(), last["loss"].get<double>(), last["rewards/accuracies"].get<double>(),
              eval["eval_rewards/accuracies"].get<double>(), eval["eval_rewards/margins"].get<double>());
  EXPECT_GT(last["rewards/accuracies"].get<double>(), 0.9);
  EXPECT_GT(eval["eval_rewards/accuracies"].get<double>(), 0.9);
  EXPECT_LT(eval["eval_loss"].get<double>(), 0.5 * std::log(2.0));
}

TEST(DPOTrainer, BadOptionsAndRowsAreErrorsThatNameThem) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  auto error_of = [&](const DPOConfig& c, const Dataset& d) -> std::string {
    try {
      DPOTrainer(t.model, tok, d, c);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  DPOConfig c = base_config(t.dir.file("bad"));
  c.loss_type = {"sigmoid", "nope"};
  EXPECT_NE(error_of(c, repeat_pairs(2)).find("DPOConfig: loss_type: unknown loss type 'nope'"), std::string::npos);
  c.loss_type = {"sigmoid", "ipo"};
  c.loss_weights = {1.0};
  EXPECT_NE(error_of(c, repeat_pairs(2)).find("loss_weights: 1 weights for 2 loss types"), std::string::npos);
  c = base_config(t.dir.file("bad"));
  c.truncation_mode = "middle";
  EXPECT_NE(error_of(c, repeat_pairs(2)).find("truncation_mode 'middle'"), std::string::npos);
  c = base_config(t.dir.file("bad"));
  c.ld_alpha = 1.5;
  EXPECT_NE(error_of(c, repeat_pairs(2)).find("DPOConfig: ld_alpha must be in [0, 1], got 1.5"), std::string::npos);
  c.ld_alpha = 0.5;
  c.loss_type = {"sigmoid", "sft"};
  EXPECT_NE(error_of(c, repeat_pairs(2)).find("ld_alpha with loss_type sft"), std::string::npos);
  c = base_config(t.dir.file("bad"));
  c.sync_ref_model = true;
  c.precompute_ref_log_probs = true;
  EXPECT_NE(error_of(c, repeat_pairs(2)).find("sync_ref_model needs a live reference"), std::string::npos);
  c = base_config(t.dir.file("bad"));
  Dataset d = repeat_pairs(3);
  d.rows[1].erase("rejected");
  const std::string m = error_of(c, d);
  EXPECT_NE(m.find("pairs.jsonl:2"), std::string::npos) << m;
  EXPECT_NE(m.find("rejected"), std::string::npos) << m;
}

}  // namespace
}  // namespace trl

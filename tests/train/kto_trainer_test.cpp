// KTOTrainer on the tiny model: the first loss is that of a policy equal to its reference; a paired dataset is
// unpaired as TRL does; the KL estimate becomes non-zero once the policy moves; precomputed == live reference;
// a rule the desirable answers follow is learned (held-out pairs ranked by the implied reward); TRL's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/preference.h"
#include "test_util.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/models/score.h"
#include "trl/train/kto_trainer.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

using test::kSanitized;

const char* kWords[] = {"apple", "river", "stone", "cloud", "green", "tiger", "piano", "light", "ocean", "bread", "chair", "music", "lemon", "glass"};

// Pairs of a rule: the chosen answer repeats the prompt's word, the rejected one says another word.
Dataset repeat_pairs(int n, int first = 0) {
  Dataset d;
  for (int i = first; i < first + n; ++i) {
    const std::string w = kWords[i % 14], other = kWords[(i + 5) % 14];
    d.rows.push_back(ojson{{"prompt", "Repeat the word " + w + ":"}, {"chosen", " " + w}, {"rejected", " " + other}});
    d.where.push_back("pairs.jsonl:" + std::to_string(i - first + 1));
  }
  return d;
}

KTOConfig base_config(const std::string& out) {
  KTOConfig c;
  c.output_dir = out;
  c.bf16 = false;
  c.learning_rate = 1e-3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  c.per_device_train_batch_size = 4;
  return c;
}

double logged(const TrainOutput& o, size_t entry, const char* key) {
  const double v = o.log_history.at(entry).at(key).get<double>();
  EXPECT_TRUE(std::isfinite(v)) << key << " at log entry " << entry;
  return v;
}

TEST(KTOData, PairsAreUnpairedAsTrlDoesAndLabelsMustBeBooleans) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  const std::vector<UnpairedExample> rows = prepare_unpaired_dataset(repeat_pairs(3), tok, PreferenceDataOptions{});
  ASSERT_EQ(rows.size(), 6u);  // the chunk's chosen rows, then its rejected rows
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(rows[i].desirable, i < 3) << i;
  EXPECT_EQ(rows[1].prompt_ids, rows[4].prompt_ids);
  EXPECT_EQ(rows[0].completion_ids, tok.encode(" apple<|im_end|>", false));
  EXPECT_EQ(rows[3].completion_ids, tok.encode(" tiger<|im_end|>", false));
  Dataset d;
  d.rows = {ojson{{"prompt", "a"}, {"completion", " b"}, {"label", true}}, ojson{{"prompt", "a"}, {"completion", " c"}, {"label", "yes"}}};
  d.where = {"rows.jsonl:1", "rows.jsonl:2"};
  try {
    prepare_unpaired_dataset(d, tok, PreferenceDataOptions{});
    ADD_FAILURE() << "a string label: no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows.jsonl:2: \"label\" must be true or false"), std::string::npos) << e.what();
  }
  d.rows[1] = ojson{{"prompt", "a"}, {"label", false}};
  try {
    prepare_unpaired_dataset(d, tok, PreferenceDataOptions{});
    ADD_FAILURE() << "no completion: no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows.jsonl:2: unpaired preference row has no \"completion\""), std::string::npos) << e.what();
  }
}

// At the start the policy is its reference: every implied reward and the KL estimate are 0, so each row's loss is
// 1 − σ(0) = 0.5 (weights 1). After a few steps the KL estimate is positive; a precomputed reference gives the same.
TEST(KTOTrainer, FirstLossIsAHalfThenTheKlTermGrowsAndPrecomputeMatches) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  KTOConfig live = base_config(t.dir.file("live"));
  live.max_steps = 6;
  KTOConfig pre = live;
  pre.output_dir = t.dir.file("pre");
  pre.precompute_ref_log_probs = true;
  KTOTrainer tl(t.model, tok, repeat_pairs(6), live), tp(t.model, tok, repeat_pairs(6), pre);
  const TrainOutput ol = tl.train(), op = tp.train();
  EXPECT_NEAR(logged(ol, 0, "loss"), 0.5, 1e-6);
  EXPECT_NEAR(logged(ol, 0, "kl"), 0.0, 1e-6);
  double largest_kl = 0;
  for (size_t s = 0; s < ol.log_history.size(); ++s) {
    largest_kl = std::max(largest_kl, logged(ol, s, "kl"));
    EXPECT_NEAR(logged(op, s, "loss"), logged(ol, s, "loss"), 1e-6) << "step " << s + 1;
    EXPECT_NEAR(logged(op, s, "kl"), logged(ol, s, "kl"), 1e-6) << "step " << s + 1;
  }
  EXPECT_GT(largest_kl, 1e-4);  // the KL term came into play
  for (const char* key : {"entropy", "rewards/chosen", "logps/chosen", "num_tokens"}) EXPECT_TRUE(ol.log_history[0].contains(key)) << key;
}

// The summed log-prob of `completion` after `prompt` under a model (the same tokenization as the trainer's).
double completion_logp(const CausalLM& m, Backend& backend, const Tokenizer& tok, const std::string& prompt, const std::string& completion) {
  const std::vector<int32_t> p = tok.encode(prompt, true), full = tok.encode(prompt + completion + "<|im_end|>", true);
  const SequenceScore s = score_sequences(m, {full}, backend).at(0);
  double sum = 0;
  for (size_t t = p.size(); t < full.size(); ++t) sum += s.token_logprobs.at(t - 1);
  return sum;
}

// Unpaired rows of the rule, desirable and undesirable alternating (as in a shuffled KTO dataset).
Dataset repeat_rows(int n) {
  Dataset d;
  for (int i = 0; i < n; ++i) {
    const std::string w = kWords[i % 14], other = kWords[(i + 5) % 14];
    d.rows.push_back(ojson{{"prompt", "Repeat the word " + w + ":"}, {"completion", " " + w}, {"label", true}});
    d.rows.push_back(ojson{{"prompt", "Repeat the word " + w + ":"}, {"completion", " " + other}, {"label", false}});
    d.where.push_back("rows.jsonl:" + std::to_string(2 * i + 1));
    d.where.push_back("rows.jsonl:" + std::to_string(2 * i + 2));
  }
  return d;
}

// Learning: trained on unpaired rows of the rule, the policy's implied reward ranks the chosen answer above the
// rejected one on (nearly) every pair.
TEST(KTOTrainer, TinyModelLearnsWhichAnswerFollowsTheRule) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  test::TinyModel t(test::kCutVocab);
  const Tokenizer& tok = test::cut_tokenizer();
  KTOConfig c = base_config(t.dir.file("learn"));
  c.bf16 = true;
  c.learning_rate = 5e-3;
  c.beta = 0.5;  // at 0.1 the tiny model needs far more steps than CI has (35 steps: 10 of 14 pairs)
  c.max_steps = 60;
  c.logging_steps = 5;
  KTOTrainer tr(t.model, tok, repeat_rows(14), c);
  const TrainOutput o = tr.train();
  const CausalLM tuned = CausalLM::from_weights(t.model.config(), tr.master_weights(), "tuned");
  auto backend = make_backend("cpu");
  int right = 0, total = 0;
  for (int i = 0; i < 14; ++i) {
    const std::string w = kWords[i], other = kWords[(i + 5) % 14], prompt = "Repeat the word " + w + ":";
    const double rc = completion_logp(tuned, *backend, tok, prompt, " " + w) - completion_logp(t.model, *backend, tok, prompt, " " + w);
    const double rr = completion_logp(tuned, *backend, tok, prompt, " " + other) - completion_logp(t.model, *backend, tok, prompt, " " + other);
    right += rc > rr, ++total;
  }
  const ojson& last = o.log_history.back();
  std::printf("[ learning ] kto: loss %.3f -> %.3f, rewards/chosen %.3f, rewards/rejected %.3f, pairs ranked right %d of %d\n",
              o.log_history.front()["loss"].get<double>(), last["loss"].get<double>(), last["rewards/chosen"].get<double>(),
              last["rewards/rejected"].get<double>(), right, total);
  EXPECT_GT(last["rewards/chosen"].get<double>(), last["rewards/rejected"].get<double>());
  EXPECT_GT(static_cast<double>(right) / total, 0.9);
}

TEST(KTOTrainer, TrlsRulesAreErrorsThatSayWhy) {
  test::TinyModel t;
  const Tokenizer& tok = test::qwen3_tokenizer();
  auto error_of = [&](const KTOConfig& c) -> std::string {
    try {
      KTOTrainer(t.model, tok, repeat_pairs(2), c);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  KTOConfig c = base_config(t.dir.file("bad"));
  c.per_device_train_batch_size = 1;
  EXPECT_NE(error_of(c).find("per_device_train_batch_size must be > 1"), std::string::npos) << error_of(c);
  c.loss_type = "apo_zero_unpaired";  // no KL term: a batch of 1 is fine
  EXPECT_EQ(error_of(c), "no error");
  c = base_config(t.dir.file("bad"));
  c.train_sampling_strategy = "random";
  EXPECT_NE(error_of(c).find("needs train_sampling_strategy sequential"), std::string::npos) << error_of(c);
  c = base_config(t.dir.file("bad"));
  c.loss_type = "kto_pair";
  EXPECT_NE(error_of(c).find("KTOConfig: loss_type"), std::string::npos) << error_of(c);
}

}  // namespace
}  // namespace trl

// The preference trainers against PyTorch (tests/reference/preference_train_reference.py, an independent
// implementation on the tiny model): 3 steps of DPO for every loss_type (LD-DPO's ld_alpha and TR-DPO's reference
// sync too), of KTO with its KL term, and of a reward model, each step's loss, TRL's metrics and the gradient norm,
// every parameter's gradient at step 1, and the reward model's saved head and the rewards it gives after training.
// The run is f32, pre-tokenized rows, batches of 2 pairs read sequentially, constant learning rate 1e-3, no
// clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "golden_util.h"
#include "test_util.h"
#include "trl/backend/registry.h"
#include "trl/models/init.h"
#include "trl/models/reward_model.h"
#include "trl/train/dpo_trainer.h"
#include "trl/train/kto_trainer.h"
#include "trl/train/reward_trainer.h"

namespace trl {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

using test::kSanitized;

const json& golden() {
  static const json g = json::parse(test::read_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/preference_train.json"));
  return g;
}

template <class Config>
Config golden_config(const std::string& out) {
  Config c;
  c.output_dir = out;
  c.bf16 = false;
  c.learning_rate = golden()["lr"].get<double>();
  c.lr_scheduler_type = "constant";
  c.max_grad_norm = 0;
  c.per_device_train_batch_size = golden()["batch"].get<int64_t>();
  c.train_sampling_strategy = "sequential";
  c.max_steps = 3;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  return c;
}

Dataset pair_rows() {
  Dataset d;
  for (const auto& p : golden()["pairs"]) {
    d.rows.push_back(ojson{{"prompt_ids", p[0]}, {"chosen_ids", p[1]}, {"rejected_ids", p[2]}});
    d.where.push_back("golden pair " + std::to_string(d.rows.size()));
  }
  return d;
}

// Every key of each golden step against the log; relative tolerance on top of an absolute one (f32 forward
// passes in a different order: ~1e-6 relative on log-probs of a few tokens).
void expect_steps(const json& want, const std::vector<ojson>& got, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < want.size(); ++s)
    for (const auto& [key, value] : want[s].items()) {
      ASSERT_TRUE(got[s].contains(key)) << what << " step " << s + 1 << ": no " << key;
      const double w = value.get<double>(), g = got[s][key].get<double>();
      const double tol = (key == "grad_norm" ? 2e-4 : 5e-5) * std::max(1.0, std::fabs(w));
      EXPECT_TRUE(std::isfinite(g) && std::fabs(g - w) <= tol) << what << " step " << s + 1 << " " << key << ": " << g << ", PyTorch " << w;
    }
}

// Captures the gradients handed to the optimizer at step 1.
template <class T>
TensorMap& capture_step1(T& trainer, TensorMap& into) {
  trainer.on_pre_optimizer_step = [&into](int64_t step, const TensorMap& grads) {
    if (step == 1)
      for (const auto& [name, g] : grads) into[name] = g.clone();
  };
  return into;
}

TEST(PreferenceGolden, DpoEveryLossTypeMatchesPyTorchFor3Steps) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  test::GoldenModel m;
  const Tokenizer& tok = test::qwen3_tokenizer();
  for (const auto& c : golden()["dpo"]) {
    const json& cfg = c["config"];
    DPOConfig d = golden_config<DPOConfig>(m.dir.file("dpo"));
    d.loss_type = cfg["loss_type"].get<std::vector<std::string>>();
    d.beta = cfg["beta"].get<double>();
    d.label_smoothing = cfg.value("label_smoothing", 0.0);
    if (cfg.contains("loss_weights")) d.loss_weights = cfg["loss_weights"].get<std::vector<double>>();
    d.f_divergence_type = cfg.value("f_divergence_type", std::string("reverse_kl"));
    if (cfg.contains("ld_alpha")) d.ld_alpha = cfg["ld_alpha"].get<double>();
    d.sync_ref_model = cfg.value("sync_ref_model", false);
    d.ref_model_mixup_alpha = cfg.value("ref_model_mixup_alpha", 0.6);
    d.ref_model_sync_steps = cfg.value("ref_model_sync_steps", int64_t{512});
    DPOTrainer tr(m.model, tok, pair_rows(), d);
    TensorMap grads;
    capture_step1(tr, grads);
    expect_steps(c["steps"], tr.train().log_history, "dpo " + cfg.dump());
    test::expect_gradients(c["grads_step1"], grads, "dpo " + cfg.dump() + " step 1 gradient of");
  }
}

TEST(PreferenceGolden, KtoWithItsKlTermMatchesPyTorchFor3Steps) {
  test::GoldenModel m;
  const json& k = golden()["kto"];
  Dataset d;
  for (const auto& r : k["rows"]) {
    d.rows.push_back(ojson{{"prompt_ids", r[0]}, {"completion_ids", r[1]}, {"label", r[2]}});
    d.where.push_back("golden row " + std::to_string(d.rows.size()));
  }
  KTOConfig c = golden_config<KTOConfig>(m.dir.file("kto"));
  c.beta = k["config"]["beta"].get<double>();
  KTOTrainer tr(m.model, test::qwen3_tokenizer(), d, c);
  TensorMap grads;
  capture_step1(tr, grads);
  const TrainOutput o = tr.train();
  expect_steps(k["steps"], o.log_history, "kto");
  test::expect_gradients(k["grads_step1"], grads, "kto step 1 gradient of");
  EXPECT_GT(k["steps"][1]["kl"].get<double>(), 0.0);  // the golden exercises a non-zero KL term (step 2; clamped at 0 in step 3)
}

TEST(PreferenceGolden, RewardModelMatchesPyTorchFor3Steps) {
  test::GoldenModel m;
  const int64_t C = m.model.config().hidden_size;
  std::vector<float> score(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) score[static_cast<size_t>(c)] = 0.05f * static_cast<float>((c * 7) % 13 - 6);
  const RewardModel rm{m.model, Tensor::from_f32(score, {1, C}), *test::qwen3_tokenizer().pad_token_id(), true};
  RewardConfig c = golden_config<RewardConfig>(m.dir.file("reward"));
  c.center_rewards_coefficient = golden()["reward"]["center_rewards_coefficient"].get<double>();
  RewardTrainer tr(rm, test::qwen3_tokenizer(), pair_rows(), c);
  TensorMap grads;
  capture_step1(tr, grads);
  expect_steps(golden()["reward"]["steps"], tr.train().log_history, "reward");
  test::expect_gradients(golden()["reward"]["grads_step1"], grads, "reward step 1 gradient of");
  // The saved sequence-classification folder: its score.weight is PyTorch's trained head, and the loaded model's
  // rewards of every pair are PyTorch's after the 3 steps.
  tr.save_model(m.dir.file("reward-saved"));
  const RewardModel saved = load_reward_model(m.dir.file("reward-saved"));
  const std::vector<float> head = saved.score.to_f32_vector();
  const json& want_head = golden()["reward"]["score_weight"];
  ASSERT_EQ(head.size(), want_head.size());
  for (size_t i = 0; i < head.size(); ++i)
    EXPECT_TRUE(std::fabs(head[i] - want_head[i].get<double>()) <= 1e-5) << "score.weight[" << i << "]: " << head[i] << ", PyTorch " << want_head[i];
  std::vector<std::vector<int32_t>> seqs;
  for (const auto& p : golden()["pairs"])
    for (int part : {1, 2}) {
      seqs.push_back(p[0].get<std::vector<int32_t>>());
      for (const auto& id : p[part]) seqs.back().push_back(id.get<int32_t>());
    }
  auto backend = make_backend("cpu");
  const std::vector<double> rewards = reward_scores(saved, seqs, *backend, 2);
  const json& want = golden()["reward"]["final_rewards"];
  for (size_t q = 0; q < rewards.size(); ++q) {
    const double w = want[q / 2][q % 2].get<double>();
    EXPECT_TRUE(std::isfinite(rewards[q]) && std::fabs(rewards[q] - w) <= 1e-4 * std::max(1.0, std::fabs(w)))
        << "reward of pair " << q / 2 + 1 << (q % 2 ? " rejected" : " chosen") << ": " << rewards[q] << ", PyTorch " << w;
  }
}

}  // namespace
}  // namespace trl

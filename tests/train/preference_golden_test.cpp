// The preference trainers against PyTorch (tests/reference/preference_train_reference.py, an independent
// implementation on the tiny model): 3 steps of DPO for every loss_type, of KTO with its KL term, and of a reward
// model, each step's loss, TRL's metrics and the gradient norm (every parameter's gradient enters it). The run is
// f32, pre-tokenized rows, batches of 2 pairs read sequentially, constant learning rate 1e-3, no clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/models/init.h"
#include "trl/models/reward_model.h"
#include "trl/train/dpo_trainer.h"
#include "trl/train/kto_trainer.h"
#include "trl/train/reward_trainer.h"

namespace trl {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

const json& golden() {
  static const json g = json::parse(test::read_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/preference_train.json"));
  return g;
}

struct GoldenModel {
  test::TempDir dir;
  CausalLM model;
  GoldenModel() : model(make()) {}
  CausalLM make() {
    InitOptions o;  // as tests/reference/make_goldens.sh makes it
    o.preset = "tiny";
    o.dtype = DType::F32;
    o.seed = 1234;
    o.initializer_range = 0.1;
    o.randomize_norms = true;
    init_model(o, dir.file("m"));
    return CausalLM::from_pretrained(dir.file("m"));
  }
};

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

TEST(PreferenceGolden, DpoEveryLossTypeMatchesPyTorchFor3Steps) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  GoldenModel m;
  const Tokenizer& tok = test::qwen3_tokenizer();
  for (const auto& c : golden()["dpo"]) {
    const json& cfg = c["config"];
    DPOConfig d = golden_config<DPOConfig>(m.dir.file("dpo"));
    d.loss_type = cfg["loss_type"].get<std::vector<std::string>>();
    d.beta = cfg["beta"].get<double>();
    d.label_smoothing = cfg.value("label_smoothing", 0.0);
    if (cfg.contains("loss_weights")) d.loss_weights = cfg["loss_weights"].get<std::vector<double>>();
    d.f_divergence_type = cfg.value("f_divergence_type", std::string("reverse_kl"));
    DPOTrainer tr(m.model, tok, pair_rows(), d);
    expect_steps(c["steps"], tr.train().log_history, "dpo " + cfg.dump());
  }
}

TEST(PreferenceGolden, KtoWithItsKlTermMatchesPyTorchFor3Steps) {
  GoldenModel m;
  const json& k = golden()["kto"];
  Dataset d;
  for (const auto& r : k["rows"]) {
    d.rows.push_back(ojson{{"prompt_ids", r[0]}, {"completion_ids", r[1]}, {"label", r[2]}});
    d.where.push_back("golden row " + std::to_string(d.rows.size()));
  }
  KTOConfig c = golden_config<KTOConfig>(m.dir.file("kto"));
  c.beta = k["config"]["beta"].get<double>();
  KTOTrainer tr(m.model, test::qwen3_tokenizer(), d, c);
  const TrainOutput o = tr.train();
  expect_steps(k["steps"], o.log_history, "kto");
  EXPECT_GT(k["steps"][1]["kl"].get<double>(), 0.0);  // the golden exercises a non-zero KL term (step 2; clamped at 0 in step 3)
}

TEST(PreferenceGolden, RewardModelMatchesPyTorchFor3Steps) {
  GoldenModel m;
  const int64_t C = m.model.config().hidden_size;
  std::vector<float> score(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) score[static_cast<size_t>(c)] = 0.05f * static_cast<float>((c * 7) % 13 - 6);
  const RewardModel rm{m.model, Tensor::from_f32(score, {1, C}), *test::qwen3_tokenizer().pad_token_id(), true};
  RewardConfig c = golden_config<RewardConfig>(m.dir.file("reward"));
  c.center_rewards_coefficient = golden()["reward"]["center_rewards_coefficient"].get<double>();
  RewardTrainer tr(rm, test::qwen3_tokenizer(), pair_rows(), c);
  expect_steps(golden()["reward"]["steps"], tr.train().log_history, "reward");
}

}  // namespace
}  // namespace trl

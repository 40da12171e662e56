// GRPO and RLOO against PyTorch (tests/reference/grpo_reference.py, an independent implementation of TRL's
// formulas on the tiny model): on a fixed round of 2 prompts × 4 completions with two reward functions (some
// None), given old and reference log-probs, the advantages, the loss, TRL's per-micro-batch metrics and every
// parameter's gradient, for each loss_type, scale_rewards, aggregation, beta > 0, sequence-level importance
// sampling, num_iterations 2 (clipped ratios), delta, mask_truncated_completions, a temperature, two micro-batches,
// and RLOO with its KL penalty, normalisation and reward clipping. The rows are padded into larger buckets than
// PyTorch's unpadded rows (prompt bucket 6, completion bucket 8), so padding is checked to change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "golden_util.h"
#include "test_util.h"
#include "train/losses/grpo_loss.h"
#include "train/online_step.h"
#include "trl/backend/program_cache.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"

namespace trl {
namespace {

using json = nlohmann::json;
constexpr int32_t kPad = 151643;

const json& golden() {
  static const json g = json::parse(test::read_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/grpo_train.json"));
  return g;
}

std::vector<double> reward_table() {
  std::vector<double> t;
  for (const auto& row : golden()["rewards"])
    for (const auto& v : row) t.push_back(v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>());
  return t;
}

// The golden's round in buckets P = 6, C = 8, with the case's old and reference log-probs.
Rollout golden_rollout(const json& c) {
  const json& g = golden();
  Rollout r;
  r.P = 6, r.C = 8;
  r.mask_truncated = c["config"].value("mask_truncated_completions", false);
  for (const auto& row : g["rows"]) {
    r.prompt_ids.push_back(g["prompts"][row[0].get<size_t>()].get<std::vector<int32_t>>());
    r.completions.push_back(row[1].get<std::vector<int32_t>>());
    r.truncated.push_back(r.completions.back().back() != g["eos"].get<int32_t>());
  }
  auto padded = [&](const json& rows) {
    std::vector<std::vector<float>> out;
    for (const auto& row : rows) {
      std::vector<float> v(static_cast<size_t>(r.C), 0.0f);
      for (size_t k = 0; k < row.size(); ++k) v[k] = row[k].get<float>();
      out.push_back(v);
    }
    return out;
  };
  if (!c["old_logp"].is_null()) r.old_logp = logp_table(padded(c["old_logp"]), r.C);
  if (!c["ref_logp"].is_null()) r.ref_logp = logp_table(padded(c["ref_logp"]), r.C);
  r.count_items();
  return r;
}

void expect_near(double got, double want, double tol, const std::string& what) {
  EXPECT_TRUE(std::isfinite(got) && std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want))) << what << ": " << got << ", PyTorch " << want;
}

// Runs the case's micro-batches on the tiny model and checks the loss, metrics and summed gradients.
void run_case(const json& c, bool rloo, const Rollout& r) {
  test::GoldenModel m;
  auto backend = make_backend("cpu");
  ProgramCache programs(*backend, 8);
  const json& cfg = c["config"];
  const std::string name = cfg["name"].get<std::string>();
  OnlineLoss L;
  L.rloo = rloo;
  L.temperature = cfg.value("temperature", 1.0);
  L.epsilon_low = 0.2, L.epsilon_high = cfg.value("epsilon_high", 0.2);
  L.grpo.loss_type = cfg.value("loss_type", "dapo");
  L.grpo.epsilon_low = L.epsilon_low, L.grpo.epsilon_high = L.epsilon_high;
  if (cfg.contains("delta")) L.grpo.delta = cfg["delta"].get<double>();
  L.grpo.beta = cfg.value("beta", 0.0);
  L.grpo.importance_sampling_level = cfg.value("importance_sampling_level", "token");
  L.grpo.max_completion_length = golden()["max_completion_length"].get<int64_t>();
  const int64_t micro = cfg.value("micro_batches", 1);
  const size_t per = r.size() / static_cast<size_t>(micro);
  double loss = 0;
  TensorMap grads;
  for (int64_t k = 0; k < micro; ++k) {
    std::vector<size_t> rows;
    for (size_t i = static_cast<size_t>(k) * per; i < static_cast<size_t>(k + 1) * per; ++i) rows.push_back(i);
    const OnlineStepResult s = online_train_step(m.model, m.model.weights(), programs, r, rows, L, micro, kPad);
    loss += s.loss;
    const json& want = c["micro_metrics"][static_cast<size_t>(k)];
    const std::vector<std::pair<const char*, double>> got = {
        {"entropy", s.metrics.entropy},
        {"kl", s.metrics.kl},
        {"clip_ratio/low_mean", s.metrics.clip_low_mean},
        {"clip_ratio/high_mean", s.metrics.clip_high_mean},
        {"clip_ratio/region_mean", s.metrics.clip_region_mean},
        {"clip_ratio/low_min", s.metrics.clip_low_min},
        {"clip_ratio/high_max", s.metrics.clip_high_max}};
    for (const auto& [key, value] : got)
      if (want.contains(key)) expect_near(value, want[key].get<double>(), 1e-5, name + " micro-batch " + std::to_string(k) + " " + key);
    for (const auto& [gname, g] : s.grads) {
      const std::string p = gname.substr(5);  // "grad.<parameter>"
      if (!grads.count(p)) grads[p] = g.clone();
      else {
        float* acc = grads[p].mutable_data_as<float>();
        const float* x = g.data_as<float>();
        for (int64_t i = 0; i < g.numel(); ++i) acc[i] += x[i];
      }
    }
  }
  expect_near(loss, c["loss"].get<double>(), 1e-5, name + " loss");
  test::expect_gradients(c["grads"], grads, name + " gradient of");
}

TEST(GrpoGolden, EveryLossTypeAndOptionMatchesPyTorch) {
  ASSERT_EQ(golden()["grpo"].size(), 16u);
  const std::vector<double> table = reward_table();
  const std::vector<double> w = golden()["reward_weights"].get<std::vector<double>>();
  const int64_t G = golden()["group"].get<int64_t>();
  for (const json& c : golden()["grpo"]) {
    const json& cfg = c["config"];
    SCOPED_TRACE(cfg["name"].get<std::string>());
    const Advantages a = grpo_advantages(table, 2, w, G, cfg.value("scale_rewards", "group"), cfg.value("multi_objective_aggregation", "sum_then_normalize"));
    ASSERT_EQ(a.advantages.size(), c["advantages"].size());
    for (size_t i = 0; i < a.advantages.size(); ++i) expect_near(a.advantages[i], c["advantages"][i].get<double>(), 1e-9, "advantage " + std::to_string(i));
    expect_near(a.frac_reward_zero_std, c["frac_reward_zero_std"].get<double>(), 1e-12, "frac_reward_zero_std");
    Rollout r = golden_rollout(c);
    r.advantages = a.advantages;
    run_case(c, false, r);
  }
}

TEST(GrpoGolden, RlooWithItsKlPenaltyMatchesPyTorch) {
  ASSERT_EQ(golden()["rloo"].size(), 4u);
  const std::vector<double> table = reward_table();
  const std::vector<double> w = golden()["reward_weights"].get<std::vector<double>>();
  for (const json& c : golden()["rloo"]) {
    const json& cfg = c["config"];
    SCOPED_TRACE(cfg["name"].get<std::string>());
    Rollout r = golden_rollout(c);
    const double beta = cfg.value("beta", 0.0);
    std::vector<double> kl;
    const std::vector<std::vector<float>> old = logp_rows(r.old_logp), ref = logp_rows(r.ref_logp);
    if (beta != 0)
      for (size_t i = 0; i < r.size(); ++i) {
        double s = 0;
        for (int64_t t = 0; t < r.C; ++t) s += (static_cast<double>(old[i][static_cast<size_t>(t)]) - ref[i][static_cast<size_t>(t)]) * r.mask(i, t);
        kl.push_back(s);
      }
    std::optional<std::pair<double, double>> clip;
    if (cfg.contains("reward_clip_range")) clip = std::make_pair(cfg["reward_clip_range"][0].get<double>(), cfg["reward_clip_range"][1].get<double>());
    const Advantages a = rloo_advantages(table, 2, w, golden()["group"].get<int64_t>(), kl, beta, clip, cfg.value("normalize_advantages", false));
    for (size_t i = 0; i < a.advantages.size(); ++i) expect_near(a.advantages[i], c["advantages"][i].get<double>(), 1e-6, "advantage " + std::to_string(i));
    expect_near(a.frac_reward_zero_std, c["frac_reward_zero_std"].get<double>(), 1e-12, "frac_reward_zero_std");
    r.advantages = a.advantages;
    run_case(c, true, r);
  }
}

// The statistics TRL's advantages rest on: NaN-aware means, Bessel-corrected deviations, NaN for fewer than two.
TEST(GrpoAdvantages, NanAwareStatisticsFollowTorch) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_DOUBLE_EQ(nanmean({1, nan, 3}), 2.0);
  EXPECT_TRUE(std::isnan(nanmean({nan, nan})));
  EXPECT_NEAR(nanstd({1, 2, 3, nan}), 1.0, 1e-15);
  EXPECT_TRUE(std::isnan(nanstd({5, nan})));  // one value: 0 · n/(n − 1) = NaN, as torch
  // An unscorable completion (every function None) gets advantage 0 and is left out of its group's baseline.
  const Advantages a = grpo_advantages({1, nan, 3, 5}, 1, {1.0}, 4, "none", "sum_then_normalize");
  EXPECT_DOUBLE_EQ(a.advantages[1], 0.0);
  EXPECT_DOUBLE_EQ(a.advantages[0], 1.0 - 3.0);
  EXPECT_TRUE(std::isnan(a.rewards[1]));
  // A group whose rewards are all equal has zero std: it counts in frac_reward_zero_std and gets advantages 0.
  const Advantages z = grpo_advantages({2, 2, 2, 2, 0, 1, 2, 3}, 1, {1.0}, 4, "group", "sum_then_normalize");
  EXPECT_DOUBLE_EQ(z.frac_reward_zero_std, 0.5);
  EXPECT_DOUBLE_EQ(z.advantages[0], 0.0);
  EXPECT_THROW(grpo_advantages({1, 2, 3}, 1, {1.0}, 2, "group", "sum_then_normalize"), Error);  // not whole groups
}

}  // namespace
}  // namespace trl

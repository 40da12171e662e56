// The preference losses (DPO, KTO, reward) against PyTorch (tests/reference/preference_loss_reference.py: every
// loss type, the gradient from torch.autograd), against central differences of themselves, and the invariants TRL
// users rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/losses/dpo_loss.h"
#include "train/losses/kto_loss.h"
#include "train/losses/reward_loss.h"
#include "trl/core/error.h"

namespace trl {
namespace {

using json = nlohmann::json;

// |got - want| <= tol·max(1, |want|), and never NaN/Inf.
void expect_close(double got, double want, double tol, const std::string& what) {
  ASSERT_TRUE(std::isfinite(got)) << what << ": " << got;
  EXPECT_LE(std::fabs(got - want), tol * std::max(1.0, std::fabs(want))) << what << ": got " << got << ", want " << want;
}

const json& goldens() {
  static const json g = json::parse(test::read_file(std::string(TRL_TEST_DATA_DIR) + "/goldens/preference_losses.json"));
  return g;
}

std::vector<DpoPair> pairs_of(const json& g) {
  std::vector<DpoPair> out;
  for (const auto& p : g["pairs"])
    out.push_back({p[0].get<double>(), p[1].get<double>(), p[2].get<double>(), p[3].get<double>(), p[4].get<int64_t>(), p[5].get<int64_t>()});
  return out;
}

DpoLossConfig config_of(const json& c) {
  DpoLossConfig cfg;
  cfg.loss_type = c["loss_type"].get<std::vector<std::string>>();
  if (c.contains("loss_weights")) cfg.loss_weights = c["loss_weights"].get<std::vector<double>>();
  cfg.beta = c["beta"].get<double>();
  cfg.label_smoothing = c.value("label_smoothing", 0.0);
  cfg.f_divergence_type = c.value("f_divergence_type", std::string("reverse_kl"));
  cfg.f_alpha_divergence_coef = c.value("f_alpha_divergence_coef", 0.5);
  return cfg;
}

std::string name_of(const DpoLossConfig& c) {
  std::string s;
  for (const std::string& t : c.loss_type) s += t + " ";
  return s + c.f_divergence_type;
}

TEST(DpoLoss, MatchesPyTorchForEveryLossType) {
  const json g = goldens()["dpo"];
  const std::vector<DpoPair> pairs = pairs_of(g);
  ASSERT_GE(g["cases"].size(), 15u);
  for (const auto& c : g["cases"]) {
    const DpoLossConfig cfg = config_of(c["config"]);
    const std::string what = name_of(cfg);
    const DpoLoss got = dpo_loss(cfg, pairs);
    expect_close(got.loss, c["loss"].get<double>(), 1e-12, what + " loss");
    for (size_t i = 0; i < pairs.size(); ++i) {
      expect_close(got.d_chosen[i], c["d_chosen"][i].get<double>(), 1e-12, what + " dL/dchosen[" + std::to_string(i) + "]");
      expect_close(got.d_rejected[i], c["d_rejected"][i].get<double>(), 1e-12, what + " dL/drejected[" + std::to_string(i) + "]");
    }
  }
}

TEST(DpoLoss, DerivativesMatchCentralDifferences) {
  const json g = goldens()["dpo"];
  for (const auto& c : g["cases"]) {
    const DpoLossConfig cfg = config_of(c["config"]);
    std::vector<DpoPair> pairs = pairs_of(g);
    const DpoLoss at = dpo_loss(cfg, pairs);
    for (size_t i = 0; i < pairs.size(); ++i)
      for (bool chosen : {true, false}) {
        double& x = chosen ? pairs[i].chosen : pairs[i].rejected;
        const double x0 = x, h = 1e-5;
        x = x0 + h;
        const double up = dpo_loss(cfg, pairs).loss;
        x = x0 - h;
        const double down = dpo_loss(cfg, pairs).loss;
        x = x0;
        const double fd = (up - down) / (2 * h), want = chosen ? at.d_chosen[i] : at.d_rejected[i];
        expect_close(want, fd, 1e-6, name_of(cfg) + (chosen ? " chosen " : " rejected ") + std::to_string(i));
      }
  }
}

TEST(DpoLoss, PolicyEqualToTheReferenceGivesLog2AndTheMetrics) {
  std::vector<DpoPair> pairs = {{-10, -12, -10, -12, 4, 5}, {-3, -1, -3, -1, 2, 2}};
  DpoLossConfig cfg;  // sigmoid, beta 0.1
  const DpoLoss l = dpo_loss(cfg, pairs);
  expect_close(l.loss, std::log(2.0), 1e-15, "first sigmoid loss");
  for (size_t i = 0; i < pairs.size(); ++i) {
    expect_close(l.d_chosen[i], -0.1 * 0.5 / 2, 1e-15, "d chosen");  // −β·σ(0)/N
    expect_close(l.d_rejected[i], 0.1 * 0.5 / 2, 1e-15, "d rejected");
  }
  EXPECT_EQ(l.rewards_accuracies, 0.0);  // equal rewards are not "chosen > rejected"
  EXPECT_EQ(l.rewards_margins, 0.0);
  expect_close(l.logps_chosen, -6.5, 1e-15, "logps/chosen");
  // Swapping chosen and rejected within each pair flips the sign of the margins; the pair order does not matter.
  pairs[0].chosen = -9;
  const DpoLoss a = dpo_loss(cfg, pairs);
  std::swap(pairs[0], pairs[1]);
  expect_close(dpo_loss(cfg, pairs).loss, a.loss, 1e-15, "pair order");
  expect_close(a.rewards_chosen, 0.1 * 1 / 2, 1e-15, "rewards/chosen");
  expect_close(a.rewards_accuracies, 0.5, 1e-15, "rewards/accuracies");
}

TEST(DpoLoss, BadOptionsAreClearErrors) {
  auto message = [](DpoLossConfig c) -> std::string {
    try {
      validate(c);
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  DpoLossConfig c;
  c.loss_type = {"sigmoid", "dpo"};
  EXPECT_NE(message(c).find("loss_type: unknown loss type 'dpo' (one of sigmoid, hinge"), std::string::npos) << message(c);
  c.loss_type = {"sigmoid", "ipo"};
  c.loss_weights = {1.0};
  EXPECT_NE(message(c).find("loss_weights: 1 weights for 2 loss types"), std::string::npos) << message(c);
  c = DpoLossConfig{};
  c.beta = 0;
  EXPECT_NE(message(c).find("beta: 0 must be a positive number"), std::string::npos) << message(c);
  c = DpoLossConfig{};
  c.loss_type = {"exo_pair"};
  EXPECT_NE(message(c).find("the exo_pair loss takes log(label_smoothing)"), std::string::npos) << message(c);
  c = DpoLossConfig{};
  c.f_divergence_type = "kl";
  EXPECT_NE(message(c).find("f_divergence_type: unknown 'kl'"), std::string::npos) << message(c);
  EXPECT_THROW(dpo_loss(DpoLossConfig{}, {}), Error);
}

TEST(KtoLoss, MatchesPyTorch) {
  const json& g = goldens()["kto"];
  std::vector<KtoRow> rows;
  for (const auto& r : g["rows"]) rows.push_back({r[0].get<double>(), r[1].get<double>(), r[2].get<bool>()});
  ASSERT_EQ(g["cases"].size(), 3u);
  for (const auto& c : g["cases"]) {
    const json& k = c["config"];
    const KtoLossConfig cfg{k["loss_type"].get<std::string>(), k["beta"].get<double>(), k["desirable_weight"].get<double>(),
                            k["undesirable_weight"].get<double>()};
    const KtoLoss got = kto_loss(cfg, rows, k["kl"].get<double>());
    expect_close(got.loss, c["loss"].get<double>(), 1e-12, cfg.loss_type + " loss");
    for (size_t i = 0; i < rows.size(); ++i) expect_close(got.d_logp[i], c["d_logp"][i].get<double>(), 1e-12, cfg.loss_type + " d_logp");
    EXPECT_EQ(got.num_chosen, 3);
    EXPECT_EQ(got.num_rejected, 2);
  }
}

TEST(KtoLoss, KlEstimateIsClampedAndWeightsAreChecked) {
  EXPECT_EQ(kto_kl_estimate({-10, -12}, {-9, -11}), 0.0);  // negative mean: clamped
  expect_close(kto_kl_estimate({-10, -12}, {-11, -12}), 0.5, 1e-15, "kl");
  EXPECT_THROW(kto_kl_estimate({-1}, {}), Error);
  KtoLossConfig c;
  EXPECT_EQ(kto_weight_warning(c, 10, 10), "");  // balanced
  EXPECT_NE(kto_weight_warning(c, 30, 10).find("set EITHER desirable_weight in [0.33, 0.44] or undesirable_weight in [2.26, 3]"), std::string::npos)
      << kto_weight_warning(c, 30, 10);
  c.desirable_weight = 0.4;
  EXPECT_EQ(kto_weight_warning(c, 30, 10), "");
  c.loss_type = "kto_pair";
  EXPECT_THROW(validate(c), Error);
}

TEST(RewardLoss, MatchesPyTorch) {
  const json& g = goldens()["reward"];
  std::vector<RewardPair> pairs;
  for (const auto& p : g["pairs"]) pairs.push_back({p[0].get<double>(), p[1].get<double>(), p[2].get<double>()});
  for (const auto& c : g["cases"]) {
    const json& coef = c["config"]["center_rewards_coefficient"];
    const RewardLoss got = reward_loss(pairs, coef.is_null() ? std::nullopt : std::optional<double>(coef.get<double>()));
    expect_close(got.loss, c["loss"].get<double>(), 1e-12, "reward loss");
    for (size_t i = 0; i < pairs.size(); ++i) {
      expect_close(got.d_chosen[i], c["d_chosen"][i].get<double>(), 1e-12, "d chosen");
      expect_close(got.d_rejected[i], c["d_rejected"][i].get<double>(), 1e-12, "d rejected");
    }
    expect_close(got.accuracy, 2.0 / 3, 1e-15, "accuracy");
    EXPECT_EQ(got.min_reward, -3.5);
    EXPECT_EQ(got.max_reward, 1.5);
  }
}

}  // namespace
}  // namespace trl

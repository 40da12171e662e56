// The reward model's two-stage training program: rewards at every position from the score head, the
// Bradley-Terry loss pooled at each row's last real token on the host, and its gradient through the score head
// and the backbone, checked against central differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/losses/reward_loss.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/models/causal_lm.h"
#include "trl/train/objectives.h"

namespace trl {
namespace {

constexpr int64_t B = 4, T = 6;  // rows [chosen 0, chosen 1, rejected 0, rejected 1]
const int64_t kLength[B] = {6, 4, 5, 3};

TensorMap inputs(const CausalLM& model, const Tensor& score) {
  TensorMap in = model.weights();
  in.erase("lm_head.weight");
  std::vector<int32_t> ids(B * T, 0), mask(B * T, 0), labels(B * T, 0), pos(B * T, 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < kLength[b]; ++t) {
      ids[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(100 + 37 * b + 11 * t);
      mask[static_cast<size_t>(b * T + t)] = 1;
      pos[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(t);
    }
  in["input_ids"] = Tensor::from_i32(ids, {B, T});
  in["attention_mask"] = Tensor::from_i32(mask, {B, T});
  in["position_ids"] = Tensor::from_i32(pos, {B, T});
  in["score.weight"] = score;
  return in;
}

// The pooled rewards (the last real token of each row) as pairs, and the seed dL/dreward[b, t].
RewardLoss pooled_loss(const Tensor& rewards, Tensor* seed) {
  std::vector<RewardPair> pairs;
  for (int64_t i = 0; i < B / 2; ++i)
    pairs.push_back({rewards.data_as<float>()[i * T + kLength[i] - 1], rewards.data_as<float>()[(i + B / 2) * T + kLength[i + B / 2] - 1], 0.0});
  RewardLoss l = reward_loss(pairs, 0.01);
  if (seed) {
    std::vector<float> s(B * T, 0.0f);
    for (int64_t i = 0; i < B / 2; ++i) {
      s[static_cast<size_t>(i * T + kLength[i] - 1)] = static_cast<float>(l.d_chosen[static_cast<size_t>(i)]);
      s[static_cast<size_t>((i + B / 2) * T + kLength[i + B / 2] - 1)] = static_cast<float>(l.d_rejected[static_cast<size_t>(i)]);
    }
    *seed = Tensor::from_f32(s, {B, T});
  }
  return l;
}

TEST(RewardGraph, GradientOfThePooledLossMatchesFiniteDifferences) {
  const test::TinyModel tiny;
  const int64_t C = tiny.model.config().hidden_size;
  std::vector<float> sv(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) sv[static_cast<size_t>(c)] = 0.05f * static_cast<float>((c * 7) % 13 - 6);
  const Tensor score = Tensor::from_f32(sv, {1, C});
  const graph::Graph g = reward_training_graph(tiny.model, B, T);
  auto backend = make_backend("cpu");
  auto program = backend->compile(g);
  const TensorMap in = inputs(tiny.model, score);
  const size_t rewards_at = g.output_index("rewards");
  auto loss_at = [&](const TensorMap& x) { return pooled_loss(program->run_stage(x, 0)[rewards_at].clone(), nullptr).loss; };
  const Tensor rewards = program->run_stage(in, 0)[rewards_at].clone();
  Tensor seed;
  pooled_loss(rewards, &seed);
  TensorMap seeds;
  seeds["reward_weights"] = seed;
  const std::vector<Tensor> out = program->run_stage(seeds, 1);
  EXPECT_THROW((void)g.output_index("grad.lm_head.weight"), Error);  // a reward model has no lm_head gradient
  for (const std::string& probe : {std::string("score.weight"), std::string("model.layers.0.mlp.up_proj.weight")}) {
    const Tensor grad = out[g.output_index("grad." + probe)].clone();
    const Tensor& w = in.at(probe);
    double largest = 0;
    for (int64_t k : {int64_t{1}, w.numel() / 2, w.numel() - 2}) {
      auto moved = [&](double delta) {
        TensorMap x = in;
        Tensor p = w.clone();
        store_element(p.mutable_data(), p.dtype(), k, load_element(w.data(), w.dtype(), k) + delta);
        x[probe] = p;
        return loss_at(x);
      };
      const double eps = 1e-2, fd = (moved(eps) - moved(-eps)) / (2 * eps), got = load_element(grad.data(), grad.dtype(), k);
      ASSERT_TRUE(std::isfinite(fd) && std::isfinite(got));
      EXPECT_NEAR(got, fd, 3e-2 * std::fabs(fd) + 1e-5) << probe << "[" << k << "]";
      largest = std::max(largest, std::fabs(fd));
    }
    EXPECT_GT(largest, 1e-4) << probe << ": the probed gradient is ~0";
  }
}

}  // namespace
}  // namespace trl

// The reward model's Bradley–Terry loss (TRL's RewardTrainer), with its exact derivative with respect to each
// pooled reward: the seed of the backward stage of a two-stage training program (docs/COMPILER.md).
//   loss = mean_i −log σ(r_c,i − r_r,i − margin_i) + c·mean_i (r_c,i + r_r,i)²
// with c = center_rewards_coefficient (absent: no centring term) and margin_i the dataset's optional `margin`.
#pragma once

#include <optional>
#include <vector>

namespace trl {

struct RewardPair {
  double chosen = 0, rejected = 0;  // the pooled rewards
  double margin = 0;
};

struct RewardLoss {
  double loss = 0;
  std::vector<double> d_chosen, d_rejected;
  // TRL's metrics: accuracy = mean [r_c > r_r], margin = mean (r_c − r_r), min/mean/max over all 2N rewards.
  double accuracy = 0, margin = 0, min_reward = 0, mean_reward = 0, max_reward = 0;
};

RewardLoss reward_loss(const std::vector<RewardPair>& pairs, std::optional<double> center_rewards_coefficient);

}  // namespace trl

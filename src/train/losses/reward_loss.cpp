#include "train/losses/reward_loss.h"

#include <algorithm>
#include <cmath>

#include "train/losses/logistic.h"
#include "trl/core/error.h"

namespace trl {

RewardLoss reward_loss(const std::vector<RewardPair>& pairs, std::optional<double> center) {
  if (pairs.empty()) fail("reward loss: a batch needs at least one pair");
  if (center && !std::isfinite(*center)) fail("center_rewards_coefficient: {} is not a finite number", *center);
  const double n = static_cast<double>(pairs.size());
  RewardLoss out;
  out.d_chosen.resize(pairs.size());
  out.d_rejected.resize(pairs.size());
  out.min_reward = INFINITY;
  out.max_reward = -INFINITY;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const RewardPair& p = pairs[i];
    const double x = p.chosen - p.rejected - p.margin;
    // −log σ(x) = log(1 + e^(−x)), stable; its derivative is −σ(−x).
    out.loss += -logistic::log_sigmoid(x) / n;
    const double s = logistic::sigmoid(-x);
    out.d_chosen[i] = -s / n;
    out.d_rejected[i] = s / n;
    if (center) {
      const double sum = p.chosen + p.rejected;
      out.loss += *center * sum * sum / n;
      out.d_chosen[i] += 2 * *center * sum / n;
      out.d_rejected[i] += 2 * *center * sum / n;
    }
    out.accuracy += (p.chosen > p.rejected ? 1.0 : 0.0) / n;
    out.margin += (p.chosen - p.rejected) / n;
    out.mean_reward += (p.chosen + p.rejected) / (2 * n);
    out.min_reward = std::min({out.min_reward, p.chosen, p.rejected});
    out.max_reward = std::max({out.max_reward, p.chosen, p.rejected});
  }
  return out;
}

}  // namespace trl

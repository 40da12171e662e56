// GRPO's and RLOO's maths on the host (docs/TRAINING.md, "trl grpo" and "trl rloo"; facts from TRL's grpo_trainer.py
// and rloo_trainer.py): advantages from the rewards of each group of completions of one prompt. The per-token
// losses they weight run where the log-probs are (trl/backend/policy_loss.h, Backend::policy_loss).
//
// Dimensions: N completions (groups of G consecutive rows share a prompt), F reward functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trl/backend/policy_loss.h"

namespace trl {

// NaN-aware statistics as TRL computes them: the mean of the non-NaN values (NaN when there is none), and the
// unbiased (Bessel-corrected) standard deviation of the non-NaN values (NaN for fewer than two).
double nanmean(const std::vector<double>& x);
double nanstd(const std::vector<double>& x);

struct Advantages {
  std::vector<double> advantages;  // [N]; 0 for an unscorable completion (every function gave None)
  std::vector<double> rewards;     // [N] Σ_f w_f·r_f of the raw rewards, NaN when unscorable (the logged `reward`)
  std::vector<double> func_mean, func_std;  // [F] nanmean and nanstd of each function's rewards
  double reward_mean = 0, reward_std = 0;   // nanmean and nanstd of `rewards`
  double frac_reward_zero_std = 0;          // the fraction of rows whose (group or batch) std is 0
};

// GRPO: `rewards` [N, F] row-major (NaN = None), `weights` [F]. scale_rewards "group" | "batch" | "none";
// aggregation "sum_then_normalize" | "normalize_then_sum". A = (r − group mean) / (std + 1e-4).
Advantages grpo_advantages(const std::vector<double>& rewards, int64_t funcs, const std::vector<double>& weights, int64_t group,
                           const std::string& scale_rewards, const std::string& aggregation);

// RLOO: r = Σ_f w_f·r_f, clipped to reward_clip_range, minus beta·kl[i] (kl: per completion Σ_t (old − ref)·m; empty
// when beta is 0); A_i = r_i − the mean of the other scorable rewards of its group; optionally normalised over the
// batch.
Advantages rloo_advantages(const std::vector<double>& rewards, int64_t funcs, const std::vector<double>& weights, int64_t group,
                           const std::vector<double>& kl, double beta, std::optional<std::pair<double, double>> reward_clip_range,
                           bool normalize_advantages);

}  // namespace trl

// GRPO's and RLOO's maths on the host (docs/TRAINING.md, "trl grpo" and "trl rloo"; facts from TRL's grpo_trainer.py
// and rloo_trainer.py): advantages from the rewards of each group of completions of one prompt, and the clipped
// surrogate losses with their derivative with respect to every completion token's log-prob, which seeds the
// backward pass of the policy's two-stage program (sequence_step.h, token_train_step).
//
// Dimensions: N completions (groups of G consecutive rows share a prompt), F reward functions, B rows of a
// micro-batch, C completion positions per row.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// One micro-batch's completion tokens, [B, C] row-major.
struct PolicyTokens {
  int64_t rows = 0, length = 0;
  std::vector<double> logp;      // log π(token) under the current weights
  std::vector<double> old_logp;  // at generation time; empty: logp itself (the ratio is 1, its gradient is not)
  std::vector<double> ref_logp;  // the reference's (needed when beta ≠ 0)
  std::vector<double> mask;      // 1 on the completion's tokens up to and including EOS, 0 after it
  std::vector<double> entropy;   // of each position's distribution (metrics only)
  std::vector<double> advantages;  // [B]
};

struct GrpoLossOptions {
  std::string loss_type = "dapo";  // grpo | bnpo | dr_grpo | dapo
  double epsilon_low = 0.2, epsilon_high = 0.2;
  std::optional<double> delta;  // caps the unclipped ratio
  double beta = 0;              // the k3 KL to the reference
  std::string importance_sampling_level = "token";  // token | sequence
  int64_t max_completion_length = 0;  // dr_grpo's normaliser
  int64_t micro_batches = 1;          // of the optimizer step (grpo, bnpo, dr_grpo divide by it)
  double num_items_in_batch = 0;      // dapo: the loss tokens of the whole generation batch
};

struct TokenLossResult {
  double loss = 0;
  std::vector<double> d_logp;  // [B, C] dL/dlogp
  // This micro-batch's metrics (NaN where TRL's would be NaN: they are left out of the logged means).
  double entropy = 0, kl = 0;
  double clip_low_mean = 0, clip_high_mean = 0, clip_region_mean = 0, clip_low_min = 0, clip_high_max = 0;
};

// GRPO's loss: ρ = exp(logp − old) per token (or exp of the row's masked mean log-ratio), per token
// ℓ = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A) + β·(exp(ref − logp) − (ref − logp) − 1), reduced by loss_type.
TokenLossResult grpo_loss(const GrpoLossOptions& options, const PolicyTokens& tokens);

// RLOO's loss: ρ_i = exp(Σ_t m·logp − Σ_t m·old) per sequence, L = mean_i −min(ρ·A, clip(ρ)·A) / micro_batches.
TokenLossResult rloo_loss(double epsilon_low, double epsilon_high, int64_t micro_batches, const PolicyTokens& tokens);

}  // namespace trl

// GRPO's and RLOO's per-token losses (docs/TRAINING.md, "trl grpo" and "trl rloo"; facts from TRL's grpo_trainer.py
// and rloo_trainer.py): the clipped surrogate of each completion token's importance ratio, with its derivative with
// respect to every token's log-prob, which seeds the backward pass of the policy's two-stage program. These are the
// plain host functions; Backend::policy_loss runs them where the log-probs are (the host backends call these, a
// device backend runs its own kernel with the same results), so only the loss and the metrics reach the host.
//
// Dimensions: B rows of a micro-batch, C completion positions per row.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trl {

// One micro-batch's completion tokens, [B, C] row-major.
struct PolicyTokens {
  int64_t rows = 0, length = 0;
  std::vector<double> logp;        // log π(token) under the current weights
  std::vector<double> old_logp;    // at generation time; empty: logp itself (the ratio is 1, its gradient is not)
  std::vector<double> ref_logp;    // the reference's (needed when beta ≠ 0)
  std::vector<double> mask;        // 1 on the completion's tokens up to and including EOS, 0 after it
  std::vector<double> entropy;     // of each position's distribution (metrics only)
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

// A micro-batch's loss and metrics (NaN where TRL's would be NaN: they are left out of the logged means).
struct PolicyLossMetrics {
  double loss = 0;
  double entropy = 0, kl = 0;
  double clip_low_mean = 0, clip_high_mean = 0, clip_region_mean = 0, clip_low_min = 0, clip_high_max = 0;
};

struct TokenLossResult : PolicyLossMetrics {
  std::vector<double> d_logp;  // [B, C] dL/dlogp
};

// GRPO's loss: ρ = exp(logp − old) per token (or exp of the row's masked mean log-ratio), per token
// ℓ = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A) + β·(exp(ref − logp) − (ref − logp) − 1), reduced by loss_type.
TokenLossResult grpo_loss(const GrpoLossOptions& options, const PolicyTokens& tokens);

// RLOO's loss: ρ_i = exp(Σ_t m·logp − Σ_t m·old) per sequence, L = mean_i −min(ρ·A, clip(ρ)·A) / micro_batches.
TokenLossResult rloo_loss(double epsilon_low, double epsilon_high, int64_t micro_batches, const PolicyTokens& tokens);

}  // namespace trl

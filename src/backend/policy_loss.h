// The host functions behind Backend::policy_loss (include/trl/backend/policy_loss.h has the options and metrics):
// GRPO's and RLOO's per-token loss in f64 on vectors of one micro-batch's values. A device backend's kernel must give
// what these give. Dimensions: B rows, C completion positions per row.
#pragma once

#include <cstdint>
#include <vector>

#include "trl/backend/policy_loss.h"

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

struct TokenLossResult : PolicyLossMetrics {
  std::vector<double> d_logp;  // [B, C] dL/dlogp
};

// GRPO's loss: ρ = exp(logp − old) per token (or exp of the row's masked mean log-ratio), per token
// ℓ = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A) + β·(exp(ref − logp) − (ref − logp) − 1), reduced by loss_type.
TokenLossResult grpo_loss(const GrpoLossOptions& options, const PolicyTokens& tokens);

// RLOO's loss: ρ_i = exp(Σ_t m·logp − Σ_t m·old) per sequence, L = mean_i −min(ρ·A, clip(ρ)·A) / micro_batches.
TokenLossResult rloo_loss(double epsilon_low, double epsilon_high, int64_t micro_batches, const PolicyTokens& tokens);

}  // namespace trl

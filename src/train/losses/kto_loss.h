// KTO's loss of the sequence log-probs (TRL's KTOTrainer), with its exact derivative: the seed of the backward
// stage of a two-stage training program (docs/COMPILER.md). Formulas: docs/TRAINING.md ("KTO").
//
// For row i: r_i = log π(y_i|x_i) − log π_ref(y_i|x_i) (completion sums); z = the KL estimate (computed by the
// caller from mismatched pairs, detached, clamped ≥ 0, so a constant here). loss_type "kto":
//   desirable:   w_d·(1 − σ(β(r − z)));   undesirable: w_u·(1 − σ(β(z − r)));
// "apo_zero_unpaired": w_d·(1 − σ(βr)) and w_u·σ(βr). The loss is the mean over the rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trl {

struct KtoLossConfig {
  std::string loss_type = "kto";  // kto | apo_zero_unpaired
  double beta = 0.1;
  double desirable_weight = 1.0;
  double undesirable_weight = 1.0;
};

// Throws trl::Error naming the option for an unknown loss_type or a weight or beta that is not a positive number.
void validate(const KtoLossConfig& config);

struct KtoRow {
  double logp = 0, ref_logp = 0;  // summed completion log-probs
  bool desirable = true;          // the dataset's `label`
};

struct KtoLoss {
  double loss = 0;
  std::vector<double> d_logp;  // dL/dlogp_i
  // TRL's metrics: kl (= z), rewards/chosen and logps/chosen (means over the desirable rows), the same for the
  // undesirable rows (rewards/rejected, logps/rejected), rewards/margins (their difference, when both exist).
  double kl = 0, rewards_chosen = 0, rewards_rejected = 0, rewards_margins = 0, logps_chosen = 0, logps_rejected = 0;
  int64_t num_chosen = 0, num_rejected = 0;
};

KtoLoss kto_loss(const KtoLossConfig& config, const std::vector<KtoRow>& rows, double kl);

// The KL estimate from the mismatched pairs' log-probs under the policy and the reference:
// max(0, mean(logp − ref_logp)). (Across ranks, the caller averages the per-rank means before the clamp.)
double kto_kl_estimate(const std::vector<double>& kl_logp, const std::vector<double>& kl_ref_logp);

// TRL's warning when the desirable and undesirable weights are out of the range KTO's paper recommends for the
// dataset's balance (eq. 8): the text, or "" when they are in range or the counts are equal.
std::string kto_weight_warning(const KtoLossConfig& config, int64_t num_desirable, int64_t num_undesirable);

}  // namespace trl

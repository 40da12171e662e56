// DPO's losses of the sequence log-probs, with their exact derivatives (the seed of the backward stage of a
// two-stage training program: docs/COMPILER.md). Every loss_type TRL's DPOTrainer has, every f_divergence_type,
// a list of loss types with loss_weights. Formulas: docs/TRAINING.md ("DPO losses").
//
// Names: for pair i, c = log π(chosen), r = log π(rejected) (sums over completion tokens), c_ref and r_ref the
// reference model's; Δc = c − c_ref, Δr = r − r_ref (the log-ratios); the scores sc, sr are f(Δc), f(Δr) for the
// f-divergence (reverse_kl: the log-ratios themselves), d = sc − sr; nc, nr the completion token counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trl {

struct DpoLossConfig {
  std::vector<std::string> loss_type = {"sigmoid"};
  std::vector<double> loss_weights;  // one per loss_type; empty: 1 each
  double beta = 0.1;
  double label_smoothing = 0.0;
  std::string f_divergence_type = "reverse_kl";  // reverse_kl | forward_kl | js_divergence | alpha_divergence
  double f_alpha_divergence_coef = 1.0;
  double discopop_tau = 0.05;
};

// Throws trl::Error naming the option for an unknown loss or divergence type, mismatched loss_weights, or values
// a loss cannot take (label_smoothing 0.5 for robust, 0 or 1 for exo_pair, beta <= 0).
void validate(const DpoLossConfig& config);

struct DpoPair {
  double chosen = 0, rejected = 0, ref_chosen = 0, ref_rejected = 0;  // summed completion log-probs
  int64_t chosen_tokens = 0, rejected_tokens = 0;                      // completion tokens (ipo, sigmoid_norm, sft)
};

struct DpoLoss {
  double loss = 0;                               // Σ_k weight_k · mean_i loss_k(i)
  std::vector<double> d_chosen, d_rejected;      // dL/dc_i and dL/dr_i (the reference values are constants)
  // TRL's metrics (means over the pairs): rewards/chosen = β·Δc, rewards/rejected = β·Δr, rewards/accuracies =
  // [β·Δc > β·Δr], rewards/margins = β·(Δc − Δr), logps/chosen, logps/rejected.
  double rewards_chosen = 0, rewards_rejected = 0, rewards_accuracies = 0, rewards_margins = 0;
  double logps_chosen = 0, logps_rejected = 0;
};

// The loss of a batch of pairs. "sft" is the cross-entropy over the chosen completions' tokens, i.e.
// −Σ_i c_i / Σ_i nc_i, as TRL computes it per batch.
DpoLoss dpo_loss(const DpoLossConfig& config, const std::vector<DpoPair>& pairs);

}  // namespace trl

// GRPO's and RLOO's per-token losses (docs/TRAINING.md, "trl grpo" and "trl rloo"; facts from TRL's grpo_trainer.py
// and rloo_trainer.py): the clipped surrogate of each completion token's importance ratio, with its derivative with
// respect to every token's log-prob, which seeds the backward pass of the policy's two-stage program.
// Backend::policy_loss runs them where the log-probs are (the host backends call the plain host functions of
// src/backend/policy_loss.h; a device backend runs its own kernel with the same results), so only the loss and the
// metrics reach the host. Here: the options and the metrics callers see.
//
// Dimensions: B rows of a micro-batch, C completion positions per row.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace trl {

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

}  // namespace trl

// One DPO micro-batch: the policy's two-stage training program (forward → sequence log-probs → the DPO loss and
// its derivative on the host → backward seeded with it) beside the frozen reference model's forward-only program,
// or reference log-probs computed before training (precompute_ref_log_probs). docs/COMPILER.md, "two-stage
// programs"; docs/TRAINING.md, "DPO losses".
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/preference.h"
#include "train/losses/dpo_loss.h"
#include "train/sequence_step.h"
#include "trl/backend/program_cache.h"
#include "trl/models/causal_lm.h"

namespace trl {

// The reference model's summed completion log-probs of each pair: run once per pair (precompute_ref_log_probs) or
// per micro-batch.
struct RefLogps {
  double chosen = 0, rejected = 0;
};

struct DpoStepOptions {
  DpoLossConfig loss;
  PreferenceDataOptions data;   // max_length, truncation_mode
  int64_t pad_to_multiple_of = 0;  // the batch length is rounded up to it (0: the longest row)
  int32_t pad_token_id = 0;
  // All 2N sequences in one row, back to back (positions restart per sequence, no attention across them), padded
  // to pad_to_multiple_of: TRL's padding_free.
  bool padding_free = false;
  // LD-DPO: the completion tokens past the shorter completion of the pair count ld_alpha times in both sequence
  // log-probs (policy and reference); nullopt: every token once.
  std::optional<double> ld_alpha;
  bool gradient_checkpointing = false;
  // The gradients are those of loss_scale · loss (1 / the micro-batches of a step: the Trainer's accumulation);
  // the reported loss is unscaled.
  double loss_scale = 1.0;
  // A mixture-of-experts policy (aux_loss_coef): + aux_coef · the load-balancing loss of the 2N rows.
  double aux_coef = 0;
};

struct DpoStepResult {
  DpoLoss loss;                        // the loss, its metrics, dL/dc and dL/dr per pair
  std::map<std::string, Tensor> grads;  // "grad.<parameter>" → f32 gradient (views into the program's arena)
  std::vector<DpoPair> pairs;          // the sequence log-probs the loss saw
  int64_t num_tokens = 0;              // real tokens of the 2N rows
  // TRL's per-batch metrics: the mean entropy over every completion token, the argmax accuracy over the chosen
  // completions' tokens.
  double entropy = 0, mean_token_accuracy = 0;
  // logits/chosen and logits/rejected: the mean logit over the vocabulary, averaged over the completion tokens.
  double logits_chosen = 0, logits_rejected = 0;
  std::optional<double> aux_loss;  // with aux_coef ≠ 0: the load-balancing loss, unweighted (not in loss.loss)
};

// The rows of a batch of pairs as the training and reference programs take them: [chosen...; rejected...] as
// padded rows, or back to back in one row with padding_free.
SequenceBatch dpo_batch(const std::vector<const PreferenceExample*>& pairs, const DpoStepOptions& options);

// The summed completion log-probs of each pair under `model` with `weights` bound, forward only.
// With `aux`: also the 2N rows' load-balancing loss (sequence_logps).
std::vector<RefLogps> dpo_sequence_logps(const CausalLM& model, const TensorMap& weights, ProgramCache& programs,
                                         const std::vector<const PreferenceExample*>& pairs, const DpoStepOptions& options,
                                         double* aux = nullptr);
// The reference model's log-probs of each pair, on its own programs (a frozen model: forward only).
std::vector<RefLogps> dpo_reference_logps(const CausalLM& reference, ProgramCache& programs, const std::vector<const PreferenceExample*>& pairs,
                                          const DpoStepOptions& options);

// Loss and gradients of one micro-batch. `policy_weights` are the policy's compute weights (by parameter name);
// the policy programs come from `policy_programs`, whose backend must not run anything else between the two
// stages (a reference model gets a ProgramCache on a backend of its own).
DpoStepResult dpo_step(const CausalLM& policy, const TensorMap& policy_weights, ProgramCache& policy_programs,
                       const std::vector<const PreferenceExample*>& pairs, const std::vector<RefLogps>& reference, const DpoStepOptions& options);

}  // namespace trl

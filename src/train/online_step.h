// One generation round of GRPO / RLOO and the training step on a chunk of it (trainers/grpo.cpp drives them;
// tests/train/grpo_golden_test.cpp runs them on given completions against PyTorch).
//
// A row is [P + C] tokens: the prompt left-padded to the round's prompt bucket P, then the completion right-padded
// to its bucket C. Completion token k sits at position P + k and is predicted at position P − 1 + k, so the
// per-token values of a row's completion are positions [P − 1, P − 1 + C): the programs run the vocabulary ops
// there only (logits_to_keep = C, as TRL computes GRPO's logits) and their per-token outputs are [B, C].
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "train/losses/grpo_loss.h"
#include "train/sequence_step.h"

namespace trl {

struct Rollout {
  int64_t epoch = -1, round = -1;
  int64_t P = 0, C = 0;                           // prompt and completion buckets
  std::vector<size_t> prompt_of;                  // [N] the trainer's prompt index of each row
  std::vector<std::vector<int32_t>> prompt_ids;   // [N] unpadded
  std::vector<std::vector<int32_t>> completions;  // [N] up to and including EOS
  std::vector<char> truncated;                    // [N] the last token is neither EOS nor pad
  std::vector<double> advantages;                 // [N]
  // [N, C] f32 in the policy's backend memory when computed (else empty): the per-token log-probs at generation
  // time and the reference's. They stay there: a micro-batch's rows are gathered from them where they are. (A round
  // loaded from a checkpoint holds host tables until the method's next step uploads them.)
  Tensor old_logp, ref_logp;
  std::vector<size_t> order;                      // the shuffled rows: chunk k is order[k·bs, (k + 1)·bs)
  double num_items = 0;                           // loss tokens of the whole round (dapo's normaliser)
  bool mask_truncated = false;                    // mask_truncated_completions

  size_t size() const { return completions.size(); }
  // The loss mask of row i's completion position c.
  double mask(size_t i, int64_t c) const;
  // Σ of the loss mask over every row (sets num_items).
  void count_items();
  // The loss mask of these rows' completion positions, [rows, C] f32 on the host.
  Tensor completion_mask(const std::vector<size_t>& rows) const;
};

// A host [N, C] f32 table of per-token log-probs from rows of C values, and back (checkpoints, data-parallel
// gathers); no rows: an empty tensor.
Tensor logp_table(const std::vector<std::vector<float>>& rows, int64_t C);
std::vector<std::vector<float>> logp_rows(const Tensor& table);

// The [rows, P + C] batch of these rows (attention over the real tokens, positions from 0 at the first prompt
// token, labels = the next token).
SFTBatch rollout_batch(const Rollout& r, const std::vector<size_t>& rows, int32_t pad_token_id);

// Per-token log-probs [N, C] f32 in `backend`'s memory of the completion positions of `rows` (the other rows
// zero), from `run` on batches of `batch` of them (`run` returns [rows, C] in memory `backend` reads: a logprobs
// program with logits_to_keep = C, the policy's or the reference's).
Tensor rollout_logps(const Rollout& r, const std::vector<size_t>& rows, int64_t batch, int32_t pad_token_id, Backend& backend,
                     const std::function<Tensor(const SFTBatch&)>& run);

struct OnlineLoss {
  bool rloo = false;
  GrpoLossOptions grpo;                    // GRPO (micro_batches and num_items_in_batch are set per step)
  double epsilon_low = 0.2, epsilon_high = 0.2;  // RLOO
  double temperature = 1.0;
  bool gradient_checkpointing = false;
  // Data parallel: the factor of this rank's share in a micro-batch whose loss is a mean over its rows (1 / world
  // size; 1 with one process, and for dapo, whose normaliser already counts every rank's tokens).
  double share = 1.0;
  // A mixture-of-experts policy: the gradients also of aux_weight · the micro-batch's load-balancing loss (TRL:
  // router_aux_loss_coef · aux / the accumulation steps, this rank's share of it under data parallel); 0: none.
  double aux_weight = 0;
};

struct OnlineStepResult {
  double loss = 0;
  PolicyLossMetrics metrics;            // entropy, kl, clip ratios of this micro-batch (its loss: share · L, as `loss`)
  std::map<std::string, Tensor> grads;  // "grad.<parameter>": views into the program's arena
  std::optional<double> aux_loss;       // with aux_weight ≠ 0: the load-balancing loss, unweighted (`loss` has aux_weight · it)
};

// The loss of one micro-batch (rows of the round) and the gradients of every parameter.
OnlineStepResult online_train_step(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const Rollout& r,
                                   const std::vector<size_t>& rows, const OnlineLoss& loss, int64_t micro_batches, int32_t pad_token_id);

}  // namespace trl

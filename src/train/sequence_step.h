// Training on losses of whole-sequence log-probs (DPO, KTO; later GRPO): a batch of sequences in fixed-shape rows,
// their summed completion log-probs from a forward-only program, and one training step through the two-stage
// training program: stage 0 gives the per-token log-probs, the host sums them per sequence and evaluates the loss
// and its derivative, stage 1 runs the backward pass seeded with dL/dlogp[b, t] = dL/d(sum of the sequence) on the
// sequence's completion tokens. docs/COMPILER.md, "two-stage programs".
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "trl/backend/program_cache.h"
#include "trl/data/sft.h"
#include "trl/models/causal_lm.h"

namespace trl {

// Sequences in a batch, and where each lies: sequence q is positions [begin, end) of batch row `row`.
struct SequenceBatch {
  SFTBatch batch;
  using Span = Backend::Span;  // {row, begin, end}
  std::vector<Span> spans;
  std::vector<int64_t> completion_tokens;  // per sequence: the positions its log-prob sums over
  // Optional f32 [B, T]: how much each completion token's log-prob counts in its sequence's sum (LD-DPO); empty:
  // once each.
  Tensor logp_weights;
};

struct SequenceLayout {
  int32_t pad_token_id = 0;
  int64_t pad_to_multiple_of = 0;  // rows are padded up to it (0: the longest row)
  int64_t max_length = 0;          // padded rows are capped at it (the sequences are already truncated)
  // Every sequence in one row, back to back (positions restart per sequence, no attention across them), padded to
  // pad_to_multiple_of: TRL's padding_free.
  bool padding_free = false;
};

SequenceBatch sequence_batch(const std::vector<SFTExample>& sequences, const SequenceLayout& layout);

// The [rows, tokens] of the largest batch of `count` sequences of these lengths under `layout` (the memory check).
std::pair<int64_t, int64_t> largest_batch_shape(std::vector<int64_t> lengths, int64_t count, const SequenceLayout& layout);

// Σ over each sequence's completion tokens of a batch's per-token [B, T] f32 values, run where the values are
// (Backend::span_sums): each token times its weight, and its logp_weights entry when `weighted` and the batch has
// them (log-probs), else plainly (entropies, matches). The batch's weights go to the backend once; the sums come
// back.
class SequenceSums {
 public:
  SequenceSums(Backend& backend, const SequenceBatch& b);
  std::vector<double> operator()(const Tensor& per_token, bool weighted = true) const;

 private:
  Backend& backend_;
  const SequenceBatch& b_;
  Tensor weights_, logp_weights_;
};

// The summed completion log-probs of every sequence under `model` with `weights` bound; forward only. With `aux`
// (an evaluation of a mixture of experts): also the batch's load-balancing loss, into *aux (0 for a dense model).
std::vector<double> sequence_logps(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const SequenceBatch& b,
                                   double* aux = nullptr);

// The loss of the sequences' log-probs: returns the loss and sets d_logps[q] = dL/dlogp_q.
using SequenceLoss = std::function<double(const std::vector<double>& logps, std::vector<double>& d_logps)>;

struct SequenceStepResult {
  double loss = 0;
  std::vector<double> logps;                 // what the loss saw
  std::map<std::string, Tensor> grads;       // "grad.<parameter>": views into the program's arena
  std::vector<double> entropy_sums, match_sums;  // per sequence, over its completion tokens
  // With logit_means: per sequence, Σ over its completion tokens of the mean logit over the vocabulary.
  std::vector<double> logit_mean_sums;
  std::optional<double> aux_loss;  // with aux_coef ≠ 0: the batch's load-balancing loss, unweighted
};

// One micro-batch: forward, the loss on the host, backward. The gradients are those of loss_scale · loss. The
// policy's programs must not run anything else between the two stages (frozen models use their own backend).
// aux_coef ≠ 0 (a mixture of experts; aux_loss_coef): the loss is L + aux_coef · aux, aux the load-balancing loss
// of the batch's rows; `loss` stays L alone.
SequenceStepResult sequence_train_step(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const SequenceBatch& b,
                                       const SequenceLoss& loss, double loss_scale, bool gradient_checkpointing, bool logit_means = false,
                                       double aux_coef = 0);

// Per-token losses (GRPO, RLOO): the loss is a function of every completion token's log-prob, not only of their
// sums. `logps` and `entropy` are the stage-0 outputs [B, T] f32 (log p(labels) and the entropy of each position's
// distribution) in the backend's memory; the loss writes every element of `seed` [B, T] f32 (allocated in the
// backend's memory) with dL/dlogp and returns L. It runs where the values are (Backend::policy_loss).
using TokenLoss = std::function<double(Backend& backend, const Tensor& logps, const Tensor& entropy, Tensor& seed)>;

struct TokenStepResult {
  double loss = 0;
  std::map<std::string, Tensor> grads;  // "grad.<parameter>": views into the program's arena
  std::optional<double> aux_loss;       // with aux_weight ≠ 0: the batch's load-balancing loss, unweighted
};

// One micro-batch of a per-token loss: stage 0, the loss, stage 1 seeded with its dL/dlogp. With a
// temperature T ≠ 1 every vocabulary quantity is of logits / T. `batch.weights` is not read. logits_to_keep K > 0:
// only the positions [T − 1 − K, T − 1) of each row (those predicting its last K tokens) go through the vocabulary,
// and `logps`, `entropy` and `seed` are [B, K] (TRL computes GRPO's logits on the completion positions only).
// aux_weight ≠ 0 (a mixture of experts): the gradients are of L + aux_weight · aux, aux the batch's load-balancing
// loss (the weight as the gradients see it: the loss's own scaling is the TokenLoss's).
TokenStepResult token_train_step(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const SFTBatch& batch,
                                 const TokenLoss& loss, bool gradient_checkpointing, double temperature = 1.0, int64_t logits_to_keep = 0,
                                 double aux_weight = 0);

// log p(labels[b, t]) [B, T] f32, forward only, of logits / temperature; [B, K] with logits_to_keep K. The program's
// output in its backend's memory: read or copy it before `programs` run again (rollout_logps copies its rows at once).
Tensor token_logprobs(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const SFTBatch& batch, double temperature = 1.0,
                      int64_t logits_to_keep = 0);

}  // namespace trl

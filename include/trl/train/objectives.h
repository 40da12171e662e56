// The training objectives: the programs the trainers compile, built over a model's decoder (CausalLM's
// build_training_hidden, vocab_head and vocab_positions), as llama.cpp keeps a model a builder and the task outside it.
// The model holds the architecture; what a trainer differentiates, and how, is here beside the trainers
// (src/train/objectives.cpp).
#pragma once

#include <cstdint>

#include "trl/core/dtype.h"
#include "trl/graph/graph.h"
#include "trl/models/causal_lm.h"

namespace trl {

// Training on per-token log-probs (SFT, and the two-stage programs of DPO, KTO, GRPO and RLOO): loss = Σ
// log p(labels)·loss_weights over [B,T], computed without materialising [B,T,V] logits (token_logprobs), and the
// gradient of every trainable parameter. Trainers choose the weights (SFT: -mask/num_items).
// Inputs: input_ids, position_ids, attention_mask, labels (i32 [B,T]: the next token at each position, any valid
// id where the weight is 0), loss_weights (f32 [B,T]), and the parameters.
// Outputs: loss (f32 scalar), then grad.<p> for each of trainable_parameters() in order.
// gradient_checkpointing: keep only each layer's input and recompute the layer in the backward pass
// (graph::rematerialize); same results bit for bit, about one layer's activations alive instead of all.
// metrics: two more outputs after the gradients, per token [B,T] f32: the entropy of the predicted distribution
// and 1 where the label is the argmax prediction (TRL's `entropy` and `mean_token_accuracy` come from them).
// logit_sums: then logit_sum [B,T] f32, Σ over the vocabulary of each position's logits (TRL's logits/* metrics).
// Last, token_logprobs [B,T] f32: log p(labels) per token.
// loss_weights is the graph's seed: as a two-stage program (Program::run_stage), stage 0 binds everything else
// and returns token_logprobs (and the metrics); stage 1 binds loss_weights = dL/d token_logprobs, for any loss L
// of the per-token log-probs computed in between, and returns the gradients of that L.
// temperature T ≠ 1: every vocabulary quantity (log-probs, entropy, logit sums) is of logits / T (GRPO, RLOO).
// logits_to_keep K > 0 (TRL's option of that name): the vocabulary ops run only at the K positions that predict
// each row's last K tokens (CausalLM::vocab_positions); labels, loss_weights and the per-token outputs are then
// [B, K], and the input kept_positions [B, K] i32 holds those positions' flat indices b·T + t.
// aux_loss (a mixture-of-experts model): the load-balancing loss joins the loss as aux_loss_weight·aux, with the
// input aux_loss_weight [] f32 a seed like loss_weights (TRL's router_aux_loss_coef, divided by the gradient
// accumulation steps for SFT); the unweighted aux loss is the last output, aux_loss [] f32 (stage 0). Ignored for a
// dense model.
struct TrainingSpec {
  int64_t batch = 1, tokens = 1;
  DType grad_dtype = DType::F32;  // the gradients' dtype (F64 for the finite-difference tests)
  bool gradient_checkpointing = false;
  bool metrics = false;     // the entropy and token_accuracy outputs
  bool logit_sums = false;  // the logit_sum output
  double temperature = 1.0;
  int64_t logits_to_keep = 0;
  bool aux_loss = false;
};
graph::Graph training_graph(const CausalLM& model, const TrainingSpec& spec);

// The coefficient of `model`'s load-balancing loss under a trainer's router_aux_loss_coef (TRL's SFT, DPO, KTO,
// GRPO and RLOO option, 0.001 by default): the option when the model has a router (a sparse layer), else 0 (TRL:
// "for other models it does nothing").
double aux_loss_coef(const CausalLM& model, double router_aux_loss_coef);
// Throws "<config_name>: router_aux_loss_coef must be a finite number >= 0, got <value>".
void check_router_aux_loss_coef(double coef, const char* config_name);
// The plain objective of a [batch, tokens] batch: no metrics, f32 gradients, temperature 1.
inline graph::Graph training_graph(const CausalLM& model, int64_t batch, int64_t tokens) {
  return training_graph(model, TrainingSpec{.batch = batch, .tokens = tokens});
}

// A reward model's training program (AutoModelForSequenceClassification with num_labels 1): the backbone, then
// the `score` head (score.weight [1, C], no bias, in the model dtype) at every position: rewards [B,T] f32, a
// stage-0 output. reward_weights [B,T] f32 is the seed: the trainer pools each row's reward at its last real
// token, computes the loss in between and seeds dL/dreward there (0 elsewhere). Outputs: loss (Σ rewards·seed,
// not the trainer's loss), grad.<p> for every backbone parameter and score.weight (lm_head has none), rewards.
graph::Graph reward_training_graph(const CausalLM& model, int64_t batch, int64_t tokens, bool gradient_checkpointing = false);

// Distillation (docs/DISTILLATION.md). hidden_graph: the teacher's side, forward only: the final hidden state
// [B, Tk, C] in the model's dtype ("hidden"), divided by `temperature` and, with logits_to_keep K > 0, gathered at
// kept_positions [B, K] i32 (vocab_positions). The lm_head it pairs with is the weight named lm_head_name().
graph::Graph hidden_graph(const CausalLM& model, int64_t batch, int64_t tokens, double temperature = 1.0, int64_t logits_to_keep = 0);
// The student's side: loss = Σ jsd·loss_weights, jsd the generalized JSD (graph::Op::Jsd, β = beta) between
// softmax(logits / temperature) of this model and of the teacher, whose hidden state (hidden_graph's output on the
// same rows and kept positions) and lm_head are the inputs teacher_hidden [B, Tk, Ct] and teacher_lm_head [V, Ct]
// in the teacher's dtype. Other inputs as training_graph's (no labels); loss_weights [B, Tk] f32. Outputs: loss,
// grad.<p> of trainable_parameters() (with `backward`), then jsd [B, Tk] f32 per position. dropout false: a LoRA
// adapter's dropout is off (TRL's disable_dropout).
struct TeacherShape {
  int64_t hidden_size = 0;
  DType dtype = DType::F32;
};
struct DistillationSpec {
  int64_t batch = 1, tokens = 1, logits_to_keep = 0;
  TeacherShape teacher;
  double beta = 0.5, temperature = 1.0;
  bool gradient_checkpointing = false;
  bool backward = true;  // false: the loss and jsd only (evaluation)
  bool dropout = true;   // false: a LoRA adapter's dropout is off
};
graph::Graph distillation_graph(const CausalLM& model, const DistillationSpec& spec);

}  // namespace trl

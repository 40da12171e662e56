#include "trl/train/objectives.h"

#include <cmath>
#include <string>
#include <vector>

#include "graph/autodiff.h"
#include "graph/passes.h"
#include "trl/core/error.h"

namespace trl {

using graph::Builder;
using graph::kNone;
using graph::ValueId;

graph::Graph training_graph(const CausalLM& model, const TrainingSpec& spec) {
  const int64_t B = spec.batch, T = spec.tokens, Tk = spec.logits_to_keep > 0 ? spec.logits_to_keep : T;
  const int64_t C = model.config().hidden_size;
  const DType dtype = model.dtype();
  Builder b;
  ValueId head = kNone;
  ValueId aux = kNone;
  const ValueId h = model.vocab_positions(b, model.build_training_hidden(b, B, T, &head, true, spec.aux_loss ? &aux : nullptr), B, T,
                                          spec.temperature, spec.logits_to_keep);
  const ValueId labels = b.input("labels", {B, Tk}, DType::I32);
  const ValueId weights = b.input("loss_weights", {B, Tk}, spec.grad_dtype == DType::F64 ? DType::F64 : DType::F32);
  b.mark_seed(weights);  // stage 1 (the loss and the backward pass) starts at the first node that reads it
  const CausalLM::VocabHead v = model.vocab_head(b, h, head);
  const ValueId logp = b.token_logprobs(v.h, v.w, labels, "token_logprobs", v.split);
  ValueId entropy = kNone, match = kNone;
  if (spec.metrics) {  // in the loss's pass over the vocabulary (graph::fuse_vocabulary_ops)
    entropy = b.entropy(v.h, v.w, "entropy", v.split);
    match = b.token_argmax_match(v.h, v.w, labels, "token_accuracy", v.split);
  }
  // Σ_v logits[b, t, v] = h[b, t] · Σ_v head[v]: the logits' sum is linear in h, so one column sum of the head
  // and a [B·T, C] × [C] product give it without a pass over the vocabulary (TRL's logits/chosen, /rejected).
  ValueId logit_sum = kNone;
  if (spec.logit_sums) {
    const ValueId column_sum = b.reshape(b.sum_rows(head, DType::F32, "head.column_sum"), {1, C}, "head.column_sum.row");
    const ValueId h32 = dtype == DType::F32 ? h : b.cast(h, DType::F32, "h.f32");
    logit_sum = b.reshape(b.matmul(h32, column_sum, kNone, DType::F32, "logit_sum"), {B, Tk}, "logit_sum.squeeze");
    const TensorParallel& tp = model.tensor_parallel();
    if (tp.size > 1) logit_sum = b.all_reduce(logit_sum, tp.group, "logit_sum.tp_out");  // the ranks' vocabulary rows
  }
  ValueId loss = b.weighted_sum(logp, weights, "loss");
  if (aux != kNone) {  // + aux_loss_weight · aux (Transformers' loss += router_aux_loss_coef · aux_loss)
    const DType ld = b.node(loss).dtype;
    const ValueId aw = b.input("aux_loss_weight", {}, ld);
    b.mark_seed(aw);
    const ValueId a = b.node(aux).dtype == ld ? aux : b.cast(aux, ld, "aux_loss.cast");
    loss = b.add(loss, b.scale_by(a, aw, ld, "aux_loss.weighted"), "loss.with_aux");
  }
  const size_t forward_nodes = b.size();
  const std::vector<std::string> names = model.trainable_parameters();
  const auto grads = graph::add_backward(b, loss, names, spec.grad_dtype);
  b.output(loss, "loss");
  for (const std::string& name : names) b.output(grads.at(name), "grad." + name);
  if (spec.metrics) b.output(entropy, "entropy"), b.output(match, "token_accuracy");
  if (spec.logit_sums) b.output(logit_sum, "logit_sum");
  b.output(logp, "token_logprobs");
  if (aux != kNone) b.output(aux, "aux_loss");
  graph::Graph g = b.finish();
  return spec.gradient_checkpointing ? graph::rematerialize(g, forward_nodes) : g;
}

double aux_loss_coef(const CausalLM& model, double router_aux_loss_coef) {
  const ModelConfig& c = model.config();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (c.sparse_layer(i)) return router_aux_loss_coef;
  return 0.0;  // dense, or a qwen3_moe config whose layers are all dense (mlp_only_layers): no router
}

void check_router_aux_loss_coef(double coef, const char* config_name) {
  if (!(std::isfinite(coef) && coef >= 0)) fail("{}: router_aux_loss_coef must be a finite number >= 0, got {}", config_name, coef);
}

graph::Graph reward_training_graph(const CausalLM& model, int64_t B, int64_t T, bool gradient_checkpointing) {
  const DType dtype = model.dtype();
  Builder b;
  ValueId head = kNone;
  const ValueId h = model.build_training_hidden(b, B, T, &head);
  const ValueId score = b.input("score.weight", {1, model.config().hidden_size}, dtype);
  const ValueId seed = b.input("reward_weights", {B, T}, DType::F32);
  b.mark_seed(seed);
  const ValueId rewards = b.cast(b.reshape(b.matmul(h, score, kNone, dtype, "score"), {B, T}, "score.squeeze"), DType::F32, "rewards");
  const ValueId loss = b.weighted_sum(rewards, seed, "loss");
  const size_t forward_nodes = b.size();
  std::vector<std::string> names;
  for (const std::string& name : model.trainable_parameters())
    if (name != "lm_head.weight" && name != "score.weight") names.push_back(name);
  names.push_back("score.weight");  // the head trains in full, with an adapter too
  const auto grads = graph::add_backward(b, loss, names);
  b.output(loss, "loss");
  for (const std::string& name : names) b.output(grads.at(name), "grad." + name);
  b.output(rewards, "rewards");
  graph::Graph g = b.finish();
  return gradient_checkpointing ? graph::rematerialize(g, forward_nodes) : g;
}

graph::Graph hidden_graph(const CausalLM& model, int64_t B, int64_t T, double temperature, int64_t logits_to_keep) {
  Builder b;
  ValueId head = kNone;
  b.output(model.vocab_positions(b, model.build_hidden(b, B, T, &head), B, T, temperature, logits_to_keep), "hidden");
  return b.finish();
}

graph::Graph distillation_graph(const CausalLM& model, const DistillationSpec& spec) {
  const int64_t B = spec.batch, T = spec.tokens, Tk = spec.logits_to_keep > 0 ? spec.logits_to_keep : T;
  const TeacherShape& teacher = spec.teacher;
  if (model.tensor_parallel().size > 1)
    fail("distillation: tensor parallel (tp_size {}) is not supported; use data parallel or FSDP", model.tensor_parallel().size);
  Builder b;
  ValueId head = kNone;
  const ValueId h = model.vocab_positions(b, model.build_training_hidden(b, B, T, &head, spec.backward && spec.dropout), B, T, spec.temperature,
                                          spec.logits_to_keep);
  const ValueId th = b.input("teacher_hidden", {B, Tk, teacher.hidden_size}, teacher.dtype);
  const ValueId tw = b.input("teacher_lm_head", {model.config().vocab_size, teacher.hidden_size}, teacher.dtype);
  const ValueId weights = b.input("loss_weights", {B, Tk}, DType::F32);
  const ValueId jsd = b.jsd(h, head, th, tw, spec.beta, "jsd");
  const ValueId loss = b.weighted_sum(jsd, weights, "loss");
  const size_t forward_nodes = b.size();
  b.output(loss, "loss");
  if (spec.backward) {
    const std::vector<std::string> names = model.trainable_parameters();
    const auto grads = graph::add_backward(b, loss, names);
    for (const std::string& name : names) b.output(grads.at(name), "grad." + name);
  }
  b.output(jsd, "jsd");
  graph::Graph g = b.finish();
  return spec.gradient_checkpointing && spec.backward ? graph::rematerialize(g, forward_nodes) : g;
}

}  // namespace trl

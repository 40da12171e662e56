#include "train/sequence_step.h"

#include <algorithm>

#include "trl/core/error.h"
#include "trl/runtime/shapes.h"
#include "trl/train/objectives.h"

namespace trl {

namespace {

// The weights and the batch as `backend`'s programs read them (the batch uploaded to a device).
TensorMap batch_inputs(Backend& backend, const TensorMap& weights, const SFTBatch& batch) {
  TensorMap in = weights;
  in["input_ids"] = to_backend(backend, batch.input_ids, "input_ids");
  in["attention_mask"] = to_backend(backend, batch.attention_mask, "attention_mask");
  in["position_ids"] = to_backend(backend, batch.position_ids, "position_ids");
  in["labels"] = to_backend(backend, batch.labels, "labels");
  return in;
}

// A [] f32 output read on the host (the aux loss), and a [] f32 input (its weight) where the program reads it.
double scalar_output(Backend& backend, const Tensor& t) {
  const Tensor host = t.is_device() ? backend.download(t) : t;
  return host.data_as<float>()[0];
}
Tensor aux_weight_input(Backend& backend, double weight) {
  return to_backend(backend, Tensor::from_f32(std::vector<float>{static_cast<float>(weight)}, {}), "aux_loss_weight");
}

}  // namespace

SequenceBatch sequence_batch(const std::vector<SFTExample>& sequences, const SequenceLayout& layout) {
  if (sequences.empty()) fail("a batch needs at least one sequence");
  std::vector<const SFTExample*> ptrs;
  for (const SFTExample& s : sequences) ptrs.push_back(&s);
  SequenceBatch out;
  if (layout.padding_free) {
    int64_t total = 0;
    for (const SFTExample* s : ptrs) {
      const int64_t n = static_cast<int64_t>(s->input_ids.size());
      out.spans.push_back({0, total, total + n});
      total += n;
    }
    out.batch = collate_packed({ptrs}, layout.pad_token_id, padded_length(total, layout.pad_to_multiple_of));
  } else {
    out.batch = collate_padded(ptrs, layout.pad_token_id, layout.pad_to_multiple_of, layout.max_length);
    for (size_t i = 0; i < ptrs.size(); ++i) out.spans.push_back({static_cast<int64_t>(i), 0, out.batch.input_ids.size(1)});
  }
  const int64_t T = out.batch.input_ids.size(1);
  const float* w = out.batch.weights.data_as<float>();
  for (const SequenceBatch::Span& s : out.spans) {
    int64_t n = 0;
    for (int64_t t = s.begin; t < s.end; ++t) n += w[s.row * T + t] != 0;
    out.completion_tokens.push_back(n);
  }
  return out;
}

std::pair<int64_t, int64_t> largest_batch_shape(std::vector<int64_t> lengths, int64_t count, const SequenceLayout& layout) {
  std::sort(lengths.rbegin(), lengths.rend());
  count = std::min<int64_t>(count, static_cast<int64_t>(lengths.size()));
  if (count == 0) return {0, 0};
  if (layout.padding_free) {
    int64_t total = 0;
    for (int64_t i = 0; i < count; ++i) total += lengths[static_cast<size_t>(i)];
    return {1, padded_length(total, layout.pad_to_multiple_of)};
  }
  const int64_t longest = lengths.front(), m = layout.pad_to_multiple_of;
  int64_t T = m > 0 ? (longest + m - 1) / m * m : longest;
  if (layout.max_length > 0) T = std::max(longest, std::min(T, layout.max_length));
  return {count, T};
}

SequenceSums::SequenceSums(Backend& backend, const SequenceBatch& b)
    : backend_(backend),
      b_(b),
      weights_(to_backend(backend, b.batch.weights, "weights")),
      logp_weights_(b.logp_weights.numel() > 0 ? to_backend(backend, b.logp_weights, "logp_weights") : Tensor()) {}

std::vector<double> SequenceSums::operator()(const Tensor& per_token, bool weighted) const {
  if (per_token.shape() != b_.batch.weights.shape())
    fail("sequence sums: {} values for a {} batch", shape_str(per_token.shape()), shape_str(b_.batch.weights.shape()));
  const bool factors = weighted && logp_weights_.numel() > 0;
  return backend_.span_sums(per_token, &weights_, factors ? &logp_weights_ : nullptr, b_.spans);
}

std::vector<double> sequence_logps(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const SequenceBatch& b,
                                   double* aux) {
  const int64_t B = b.batch.input_ids.size(0), T = b.batch.input_ids.size(1);
  const graph::Graph g = aux ? model.logprobs_aux_graph(B, T) : model.logprobs_graph(B, T);
  Backend& backend = programs.backend();
  const std::vector<Tensor> out = programs.get(g).run(batch_inputs(backend, weights, b.batch));
  if (aux) *aux = g.output_indices().count("aux_loss") ? scalar_output(backend, out.at(g.output_index("aux_loss"))) : 0.0;
  return SequenceSums(backend, b)(out.at(g.output_index("token_logprobs")));
}

SequenceStepResult sequence_train_step(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const SequenceBatch& b,
                                       const SequenceLoss& loss, double loss_scale, bool gradient_checkpointing, bool logit_means,
                                       double aux_coef) {
  const int64_t R = b.batch.input_ids.size(0), T = b.batch.input_ids.size(1);
  const graph::Graph g = training_graph(
      model, {.batch = R, .tokens = T, .gradient_checkpointing = gradient_checkpointing, .metrics = true, .logit_sums = logit_means, .aux_loss = aux_coef != 0});
  Program& program = programs.get(g);
  Backend& backend = programs.backend();
  // Stage 0: the per-token log-probs and metrics, summed per sequence where they are; the sums come to the host.
  const TensorMap inputs = batch_inputs(backend, weights, b.batch);
  const std::vector<Tensor> first = program.run_stage(inputs, 0);
  const SequenceSums sums(backend, b);
  auto per_token = [&](const char* name) { return first.at(g.output_index(name)); };
  SequenceStepResult out;
  out.logps = sums(per_token("token_logprobs"));
  out.entropy_sums = sums(per_token("entropy"), false);
  out.match_sums = sums(per_token("token_accuracy"), false);
  if (logit_means) {
    const double V = static_cast<double>(model.config().vocab_size);
    for (double sum : sums(per_token("logit_sum"), false)) out.logit_mean_sums.push_back(sum / V);
  }
  if (aux_coef != 0) out.aux_loss = scalar_output(backend, per_token("aux_loss"));
  std::vector<double> d(out.logps.size(), 0.0);
  out.loss = loss(out.logps, d);
  // Stage 1: seeded with loss_scale · dL/dlogp_q · weights[b, t] over each sequence's span.
  Tensor seed = Tensor::zeros(DType::F32, {R, T});
  float* s = seed.mutable_data_as<float>();
  const float* w = b.batch.weights.data_as<float>();
  const float* lw = b.logp_weights.numel() > 0 ? b.logp_weights.data_as<float>() : nullptr;
  for (size_t q = 0; q < b.spans.size(); ++q) {
    const double dq = loss_scale * d[q];
    const SequenceBatch::Span& sp = b.spans[q];
    for (int64_t t = sp.begin; t < sp.end; ++t) {
      const int64_t i = sp.row * T + t;
      s[i] = static_cast<float>(dq * w[i] * (lw ? lw[i] : 1.0f));
    }
  }
  TensorMap seeds;
  seeds["loss_weights"] = to_backend(backend, seed, "loss_weights");
  if (aux_coef != 0) seeds["aux_loss_weight"] = aux_weight_input(backend, loss_scale * aux_coef);
  const std::vector<Tensor> results = program.run_stage(seeds, 1);
  for (const auto& [name, index] : g.output_indices())
    if (name.rfind("grad.", 0) == 0) out.grads[name] = results.at(index);
  return out;
}

namespace {
// The inputs of a logits_to_keep program: the labels of the kept positions [B, K] and their flat indices.
TensorMap kept_inputs(Backend& backend, const TensorMap& weights, const SFTBatch& batch, int64_t K) {
  TensorMap in = batch_inputs(backend, weights, batch);
  if (K == 0) return in;
  const int64_t B = batch.input_ids.size(0), T = batch.input_ids.size(1);
  if (K < 0 || K >= T) fail("logits_to_keep must be in [1, {}) for rows of {} tokens, got {}", T, T, K);
  Tensor labels = Tensor::zeros(DType::I32, {B, K}), positions = Tensor::zeros(DType::I32, {B, K});
  const int32_t* all = batch.labels.data_as<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t t = T - 1 - K + k;
      labels.mutable_data_as<int32_t>()[b * K + k] = all[b * T + t];
      positions.mutable_data_as<int32_t>()[b * K + k] = static_cast<int32_t>(b * T + t);
    }
  in["labels"] = to_backend(backend, labels, "labels");
  in["kept_positions"] = to_backend(backend, positions, "kept_positions");
  return in;
}
}  // namespace

TokenStepResult token_train_step(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const SFTBatch& batch,
                                 const TokenLoss& loss, bool gradient_checkpointing, double temperature, int64_t logits_to_keep,
                                 double aux_weight) {
  const int64_t R = batch.input_ids.size(0), T = batch.input_ids.size(1), Tk = logits_to_keep > 0 ? logits_to_keep : T;
  const graph::Graph g = training_graph(model, {.batch = R,
                                                .tokens = T,
                                                .gradient_checkpointing = gradient_checkpointing,
                                                .metrics = true,
                                                .temperature = temperature,
                                                .logits_to_keep = logits_to_keep,
                                                .aux_loss = aux_weight != 0});
  Program& program = programs.get(g);
  Backend& backend = programs.backend();
  const std::vector<Tensor> first = program.run_stage(kept_inputs(backend, weights, batch, logits_to_keep), 0);
  TokenStepResult out;
  if (aux_weight != 0) out.aux_loss = scalar_output(backend, first.at(g.output_index("aux_loss")));
  Tensor seed = backend.allocate(DType::F32, {R, Tk}, "loss_weights");
  out.loss = loss(backend, first.at(g.output_index("token_logprobs")), first.at(g.output_index("entropy")), seed);
  TensorMap seeds;
  seeds["loss_weights"] = seed;
  if (aux_weight != 0) seeds["aux_loss_weight"] = aux_weight_input(backend, aux_weight);
  const std::vector<Tensor> results = program.run_stage(seeds, 1);
  for (const auto& [name, index] : g.output_indices())
    if (name.rfind("grad.", 0) == 0) out.grads[name] = results.at(index);
  return out;
}

Tensor token_logprobs(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const SFTBatch& batch, double temperature,
                      int64_t logits_to_keep) {
  const graph::Graph g = model.logprobs_graph(batch.input_ids.size(0), batch.input_ids.size(1), temperature, logits_to_keep);
  Backend& backend = programs.backend();
  return programs.get(g).run(kept_inputs(backend, weights, batch, logits_to_keep)).at(g.output_index("token_logprobs"));
}

}  // namespace trl

#include "train/dpo_step.h"

#include "trl/core/error.h"
#include "trl/runtime/shapes.h"

namespace trl {

namespace {

// Σ_t weights·values over each sequence's span: the summed completion log-probs (weights are 1 where position t
// predicts a completion token), or the sums of a per-token metric.
std::vector<double> span_sums(const DpoBatch& b, const Tensor& values) {
  const int64_t T = b.batch.input_ids.size(1);
  const float* v = values.data_as<float>();
  const float* w = b.batch.weights.data_as<float>();
  std::vector<double> out;
  for (const DpoBatch::Span& s : b.spans) {
    double sum = 0;
    for (int64_t t = s.begin; t < s.end; ++t)
      if (w[s.row * T + t] != 0) sum += static_cast<double>(w[s.row * T + t]) * v[s.row * T + t];
    out.push_back(sum);
  }
  return out;
}

// Completion tokens of each sequence (what ipo, sigmoid_norm and sft divide by).
std::vector<int64_t> span_tokens(const DpoBatch& b) {
  const int64_t T = b.batch.input_ids.size(1);
  const float* w = b.batch.weights.data_as<float>();
  std::vector<int64_t> out;
  for (const DpoBatch::Span& s : b.spans) {
    int64_t n = 0;
    for (int64_t t = s.begin; t < s.end; ++t) n += w[s.row * T + t] != 0;
    out.push_back(n);
  }
  return out;
}

TensorMap batch_inputs(const TensorMap& weights, const SFTBatch& batch) {
  TensorMap in = weights;
  in["input_ids"] = batch.input_ids;
  in["attention_mask"] = batch.attention_mask;
  in["position_ids"] = batch.position_ids;
  in["labels"] = batch.labels;
  return in;
}

}  // namespace

DpoBatch dpo_batch(const std::vector<const PreferenceExample*>& pairs, const DpoStepOptions& o) {
  if (pairs.empty()) fail("dpo: a micro-batch needs at least one pair");
  const std::vector<SFTExample> rows = preference_rows(pairs, o.data);
  std::vector<const SFTExample*> ptrs;
  for (const SFTExample& r : rows) ptrs.push_back(&r);
  DpoBatch out;
  if (o.padding_free) {
    int64_t total = 0;
    for (const SFTExample* r : ptrs) {
      const int64_t n = static_cast<int64_t>(r->input_ids.size());
      out.spans.push_back({0, total, total + n});
      total += n;
    }
    out.batch = collate_packed({ptrs}, o.pad_token_id, padded_length(total, o.pad_to_multiple_of));
    return out;
  }
  out.batch = collate_padded(ptrs, o.pad_token_id, o.pad_to_multiple_of, o.data.max_length);
  for (size_t i = 0; i < ptrs.size(); ++i) out.spans.push_back({static_cast<int64_t>(i), 0, out.batch.input_ids.size(1)});
  return out;
}

std::vector<RefLogps> dpo_reference_logps(const CausalLM& reference, ProgramCache& programs, const std::vector<const PreferenceExample*>& pairs,
                                          const DpoStepOptions& o) {
  return dpo_sequence_logps(reference, reference.weights(), programs, pairs, o);
}

std::vector<RefLogps> dpo_sequence_logps(const CausalLM& model, const TensorMap& weights, ProgramCache& programs,
                                         const std::vector<const PreferenceExample*>& pairs, const DpoStepOptions& o) {
  const DpoBatch b = dpo_batch(pairs, o);
  const int64_t R = b.batch.input_ids.size(0), T = b.batch.input_ids.size(1), N = static_cast<int64_t>(pairs.size());
  const graph::Graph g = model.logprobs_graph(R, T);
  const Tensor logp = programs.get(g).run(batch_inputs(weights, b.batch)).at(g.output_index("token_logprobs"));
  const std::vector<double> sums = span_sums(b, logp);
  std::vector<RefLogps> out(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) out[static_cast<size_t>(i)] = {sums[static_cast<size_t>(i)], sums[static_cast<size_t>(N + i)]};
  return out;
}

DpoStepResult dpo_step(const CausalLM& policy, const TensorMap& policy_weights, ProgramCache& policy_programs,
                       const std::vector<const PreferenceExample*>& pairs, const std::vector<RefLogps>& reference, const DpoStepOptions& o) {
  if (reference.size() != pairs.size()) fail("dpo: {} reference log-probs for {} pairs", reference.size(), pairs.size());
  const DpoBatch b = dpo_batch(pairs, o);
  const int64_t R = b.batch.input_ids.size(0), T = b.batch.input_ids.size(1), N = static_cast<int64_t>(pairs.size());
  const graph::Graph g = policy.training_graph(R, T, DType::F32, o.gradient_checkpointing, /*metrics=*/true);
  Program& program = policy_programs.get(g);
  // Stage 0: the policy's per-token log-probs (and the per-token metrics); the host sums them per completion.
  const TensorMap inputs = batch_inputs(policy_weights, b.batch);
  const std::vector<Tensor> first = program.run_stage(inputs, 0);
  const std::vector<double> sums = span_sums(b, first.at(g.output_index("token_logprobs")));
  const std::vector<double> entropy = span_sums(b, first.at(g.output_index("entropy")));
  const std::vector<double> match = span_sums(b, first.at(g.output_index("token_accuracy")));
  const std::vector<int64_t> tokens = span_tokens(b);
  DpoStepResult out;
  out.num_tokens = b.batch.num_tokens;
  double entropy_sum = 0, match_sum = 0;
  int64_t all_tokens = 0, chosen_tokens = 0;
  for (int64_t i = 0; i < N; ++i) {
    const size_t c = static_cast<size_t>(i), r = static_cast<size_t>(N + i);
    const RefLogps& ref = reference[c];
    out.pairs.push_back({sums[c], sums[r], ref.chosen, ref.rejected, tokens[c], tokens[r]});
    entropy_sum += entropy[c] + entropy[r], all_tokens += tokens[c] + tokens[r];
    match_sum += match[c], chosen_tokens += tokens[c];
  }
  out.entropy = all_tokens ? entropy_sum / static_cast<double>(all_tokens) : 0.0;
  out.mean_token_accuracy = chosen_tokens ? match_sum / static_cast<double>(chosen_tokens) : 0.0;
  out.loss = dpo_loss(o.loss, out.pairs);
  // Stage 1: seeded with dL/dlogp[b, t] = loss_scale · dL/d(sequence sum) · weights[b, t] over each sequence's span.
  Tensor seed = Tensor::zeros(DType::F32, {R, T});
  float* s = seed.mutable_data_as<float>();
  const float* w = b.batch.weights.data_as<float>();
  for (int64_t q = 0; q < 2 * N; ++q) {
    const double d = o.loss_scale * (q < N ? out.loss.d_chosen[static_cast<size_t>(q)] : out.loss.d_rejected[static_cast<size_t>(q - N)]);
    const DpoBatch::Span& sp = b.spans[static_cast<size_t>(q)];
    for (int64_t t = sp.begin; t < sp.end; ++t) s[sp.row * T + t] = static_cast<float>(d * w[sp.row * T + t]);
  }
  TensorMap seeds;
  seeds["loss_weights"] = seed;
  const std::vector<Tensor> results = program.run_stage(seeds, 1);
  for (const auto& [name, index] : g.output_indices())
    if (name.rfind("grad.", 0) == 0) out.grads[name] = results.at(index);
  return out;
}

}  // namespace trl

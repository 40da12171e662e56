#include "train/dpo_step.h"

#include "trl/core/error.h"
#include "trl/runtime/runtime.h"

namespace trl {

namespace {

// Σ_t weights[b, t]·logp[b, t] per row: the summed completion log-probs (weights are 1 where position t predicts
// a completion token).
std::vector<double> row_sums(const Tensor& logp, const Tensor& weights) {
  const int64_t R = logp.size(0), T = logp.size(1);
  std::vector<double> out(static_cast<size_t>(R), 0.0);
  const float* lp = logp.data_as<float>();
  const float* w = weights.data_as<float>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < T; ++t)
      if (w[r * T + t] != 0) out[static_cast<size_t>(r)] += static_cast<double>(w[r * T + t]) * lp[r * T + t];
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

SFTBatch dpo_batch(const std::vector<const PreferenceExample*>& pairs, const DpoStepOptions& o) {
  if (pairs.empty()) fail("dpo: a micro-batch needs at least one pair");
  const std::vector<SFTExample> rows = preference_rows(pairs, o.data);
  std::vector<const SFTExample*> ptrs;
  for (const SFTExample& r : rows) ptrs.push_back(&r);
  return collate_padded(ptrs, o.pad_token_id, o.pad_to_multiple_of, o.data.max_length);
}

std::vector<RefLogps> dpo_reference_logps(const CausalLM& reference, ProgramCache& programs, const std::vector<const PreferenceExample*>& pairs,
                                          const DpoStepOptions& o) {
  const SFTBatch batch = dpo_batch(pairs, o);
  const int64_t R = batch.input_ids.size(0), T = batch.input_ids.size(1), N = static_cast<int64_t>(pairs.size());
  const graph::Graph g = reference.logprobs_graph(R, T);
  const Tensor logp = programs.get(g).run(batch_inputs(reference.weights(), batch)).at(g.output_index("token_logprobs"));
  const std::vector<double> sums = row_sums(logp, batch.weights);
  std::vector<RefLogps> out(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) out[static_cast<size_t>(i)] = {sums[static_cast<size_t>(i)], sums[static_cast<size_t>(N + i)]};
  return out;
}

DpoStepResult dpo_step(const CausalLM& policy, const TensorMap& policy_weights, ProgramCache& policy_programs,
                       const std::vector<const PreferenceExample*>& pairs, const std::vector<RefLogps>& reference, const DpoStepOptions& o) {
  if (reference.size() != pairs.size()) fail("dpo: {} reference log-probs for {} pairs", reference.size(), pairs.size());
  const SFTBatch batch = dpo_batch(pairs, o);
  const int64_t R = batch.input_ids.size(0), T = batch.input_ids.size(1), N = static_cast<int64_t>(pairs.size());
  const graph::Graph g = policy.training_graph(R, T);
  Program& program = policy_programs.get(g);
  // Stage 0: the policy's per-token log-probs; the host sums them per completion.
  const TensorMap inputs = batch_inputs(policy_weights, batch);
  const Tensor logp = program.run_stage(inputs, 0).at(g.output_index("token_logprobs"));
  const std::vector<double> sums = row_sums(logp, batch.weights);
  DpoStepResult out;
  out.num_tokens = batch.num_tokens;
  const float* w = batch.weights.data_as<float>();
  auto tokens = [&](int64_t row) {  // completion tokens the row's log-prob sums over
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t) n += w[row * T + t] != 0;
    return n;
  };
  for (int64_t i = 0; i < N; ++i) {
    const RefLogps& ref = reference[static_cast<size_t>(i)];
    out.pairs.push_back({sums[static_cast<size_t>(i)], sums[static_cast<size_t>(N + i)], ref.chosen, ref.rejected, tokens(i), tokens(N + i)});
  }
  out.loss = dpo_loss(o.loss, out.pairs);
  // Stage 1: seeded with dL/dlogp[b, t] = dL/d(row sum b) · weights[b, t].
  Tensor seed = Tensor::zeros(DType::F32, {R, T});
  float* s = seed.mutable_data_as<float>();
  for (int64_t r = 0; r < R; ++r) {
    const double d = r < N ? out.loss.d_chosen[static_cast<size_t>(r)] : out.loss.d_rejected[static_cast<size_t>(r - N)];
    for (int64_t t = 0; t < T; ++t) s[r * T + t] = static_cast<float>(d * w[r * T + t]);
  }
  TensorMap seeds;
  seeds["loss_weights"] = seed;
  const std::vector<Tensor> results = program.run_stage(seeds, 1);
  for (const auto& [name, index] : g.output_indices())
    if (name.rfind("grad.", 0) == 0) out.grads[name] = results.at(index);
  return out;
}

}  // namespace trl

#include "train/dpo_step.h"

#include <algorithm>

#include "trl/core/error.h"

namespace trl {

SequenceBatch dpo_batch(const std::vector<const PreferenceExample*>& pairs, const DpoStepOptions& o) {
  if (pairs.empty()) fail("dpo: a micro-batch needs at least one pair");
  SequenceBatch b = sequence_batch(preference_rows(pairs, o.data), SequenceLayout{o.pad_token_id, o.pad_to_multiple_of, o.data.max_length, o.padding_free});
  if (o.ld_alpha) {
    // Sequence q's completion tokens after the first `shared` (the pair's shorter completion) weigh ld_alpha.
    const size_t N = pairs.size();
    const int64_t T = b.batch.input_ids.size(1);
    const float* w = b.batch.weights.data_as<float>();
    b.logp_weights = Tensor::zeros(DType::F32, b.batch.weights.shape());
    float* lw = b.logp_weights.mutable_data_as<float>();
    for (size_t q = 0; q < 2 * N; ++q) {
      const int64_t shared = std::min(b.completion_tokens[q % N], b.completion_tokens[N + q % N]);
      const SequenceBatch::Span& s = b.spans[q];
      int64_t seen = 0;
      for (int64_t t = s.begin; t < s.end; ++t)
        if (w[s.row * T + t] != 0) lw[s.row * T + t] = ++seen > shared ? static_cast<float>(*o.ld_alpha) : 1.0f;
    }
  }
  return b;
}

std::vector<RefLogps> dpo_reference_logps(const CausalLM& reference, ProgramCache& programs, const std::vector<const PreferenceExample*>& pairs,
                                          const DpoStepOptions& o) {
  return dpo_sequence_logps(reference, reference.weights(), programs, pairs, o);
}

std::vector<RefLogps> dpo_sequence_logps(const CausalLM& model, const TensorMap& weights, ProgramCache& programs,
                                         const std::vector<const PreferenceExample*>& pairs, const DpoStepOptions& o, double* aux) {
  const std::vector<double> sums = sequence_logps(model, weights, programs, dpo_batch(pairs, o), aux);
  const size_t N = pairs.size();
  std::vector<RefLogps> out(N);
  for (size_t i = 0; i < N; ++i) out[i] = {sums[i], sums[N + i]};
  return out;
}

DpoStepResult dpo_step(const CausalLM& policy, const TensorMap& policy_weights, ProgramCache& policy_programs,
                       const std::vector<const PreferenceExample*>& pairs, const std::vector<RefLogps>& reference, const DpoStepOptions& o) {
  if (reference.size() != pairs.size()) fail("dpo: {} reference log-probs for {} pairs", reference.size(), pairs.size());
  const SequenceBatch b = dpo_batch(pairs, o);
  const size_t N = pairs.size();
  DpoStepResult out;
  // The loss of the 2N sums [chosen...; rejected...] against the reference's.
  const SequenceLoss loss = [&](const std::vector<double>& sums, std::vector<double>& d) {
    for (size_t i = 0; i < N; ++i)
      out.pairs.push_back({sums[i], sums[N + i], reference[i].chosen, reference[i].rejected, b.completion_tokens[i], b.completion_tokens[N + i]});
    out.loss = dpo_loss(o.loss, out.pairs);
    for (size_t i = 0; i < N; ++i) d[i] = out.loss.d_chosen[i], d[N + i] = out.loss.d_rejected[i];
    return out.loss.loss;
  };
  SequenceStepResult r = sequence_train_step(policy, policy_weights, policy_programs, b, loss, o.loss_scale, o.gradient_checkpointing, /*logit_means=*/true,
                                             o.aux_coef);
  out.grads = std::move(r.grads);
  out.aux_loss = r.aux_loss;
  out.num_tokens = b.batch.num_tokens;
  // TRL's entropy is over every completion token of the batch; its token accuracy over the chosen completions.
  double entropy = 0, match = 0, logits_c = 0, logits_r = 0;
  int64_t all = 0, chosen = 0;
  for (size_t q = 0; q < 2 * N; ++q) entropy += r.entropy_sums[q], all += b.completion_tokens[q];
  for (size_t i = 0; i < N; ++i) match += r.match_sums[i], chosen += b.completion_tokens[i];
  for (size_t i = 0; i < N; ++i) logits_c += r.logit_mean_sums[i], logits_r += r.logit_mean_sums[N + i];
  out.entropy = all ? entropy / static_cast<double>(all) : 0.0;
  out.mean_token_accuracy = chosen ? match / static_cast<double>(chosen) : 0.0;
  out.logits_chosen = chosen ? logits_c / static_cast<double>(chosen) : 0.0;
  out.logits_rejected = all > chosen ? logits_r / static_cast<double>(all - chosen) : 0.0;
  return out;
}

}  // namespace trl

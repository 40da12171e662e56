#include "train/online_step.h"

#include "trl/core/error.h"

namespace trl {

double Rollout::mask(size_t i, int64_t c) const {
  if (mask_truncated && truncated[i]) return 0;
  return c < static_cast<int64_t>(completions[i].size()) ? 1.0 : 0.0;
}

void Rollout::count_items() {
  num_items = 0;
  for (size_t i = 0; i < size(); ++i)
    for (int64_t c = 0; c < C; ++c) num_items += mask(i, c);
}

SFTBatch rollout_batch(const Rollout& r, const std::vector<size_t>& rows, int32_t pad) {
  const int64_t B = static_cast<int64_t>(rows.size()), T = r.P + r.C;
  SFTBatch b;
  b.input_ids = Tensor::zeros(DType::I32, {B, T});
  b.attention_mask = Tensor::zeros(DType::I32, {B, T});
  b.labels = Tensor::zeros(DType::I32, {B, T});
  b.weights = Tensor::zeros(DType::F32, {B, T});
  int32_t* ids = b.input_ids.mutable_data_as<int32_t>();
  int32_t* mask = b.attention_mask.mutable_data_as<int32_t>();
  int32_t* labels = b.labels.mutable_data_as<int32_t>();
  for (int64_t k = 0; k < B; ++k) {
    const size_t i = rows[static_cast<size_t>(k)];
    const std::vector<int32_t>& p = r.prompt_ids.at(i);
    const std::vector<int32_t>& c = r.completions.at(i);
    if (static_cast<int64_t>(p.size()) > r.P || static_cast<int64_t>(c.size()) > r.C || p.empty())
      fail("rollout row {}: a prompt of {} and a completion of {} tokens do not fit the buckets {} + {}", i, p.size(), c.size(), r.P, r.C);
    int32_t* row_ids = ids + k * T;
    int32_t* row_mask = mask + k * T;
    const int64_t off = r.P - static_cast<int64_t>(p.size());
    for (int64_t t = 0; t < T; ++t) row_ids[t] = pad;
    for (size_t t = 0; t < p.size(); ++t) row_ids[off + static_cast<int64_t>(t)] = p[t], row_mask[off + static_cast<int64_t>(t)] = 1;
    for (size_t t = 0; t < c.size(); ++t) row_ids[r.P + static_cast<int64_t>(t)] = c[t], row_mask[r.P + static_cast<int64_t>(t)] = 1;
    for (int64_t t = 0; t + 1 < T; ++t) labels[k * T + t] = row_ids[t + 1];
    labels[k * T + T - 1] = pad;
    b.num_tokens += static_cast<int64_t>(p.size() + c.size());
  }
  b.position_ids = default_position_ids(b.attention_mask);
  return b;
}

std::vector<std::vector<float>> rollout_logps(const Rollout& r, const std::vector<size_t>& which, int64_t batch, int32_t pad,
                                              const std::function<Tensor(const SFTBatch&)>& run) {
  std::vector<std::vector<float>> out(r.size());
  for (size_t s = 0; s < which.size(); s += static_cast<size_t>(batch)) {
    const std::vector<size_t> rows(which.begin() + static_cast<int64_t>(s), which.begin() + static_cast<int64_t>(std::min(which.size(), s + static_cast<size_t>(batch))));
    const Tensor lp = run(rollout_batch(r, rows, pad));  // [rows, C]: logits_to_keep = C
    if (lp.shape() != Shape{static_cast<int64_t>(rows.size()), r.C}) fail("rollout_logps: {} log-probs for {} rows of {} completion positions", shape_str(lp.shape()), rows.size(), r.C);
    const float* x = lp.data_as<float>();
    for (size_t k = 0; k < rows.size(); ++k) out[rows[k]].assign(x + static_cast<int64_t>(k) * r.C, x + static_cast<int64_t>(k + 1) * r.C);
  }
  return out;
}

OnlineStepResult online_train_step(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const Rollout& r,
                                   const std::vector<size_t>& rows, const OnlineLoss& L, int64_t micro_batches, int32_t pad) {
  const SFTBatch b = rollout_batch(r, rows, pad);
  const int64_t B = static_cast<int64_t>(rows.size());
  OnlineStepResult out;
  const TokenLoss loss = [&](const Tensor& logps, const Tensor& entropy, Tensor& seed) {
    PolicyTokens pt;
    pt.rows = B, pt.length = r.C;
    const float* lp = logps.data_as<float>();
    const float* en = entropy.data_as<float>();
    for (int64_t k = 0; k < B; ++k) {
      const size_t i = rows[static_cast<size_t>(k)];
      pt.advantages.push_back(r.advantages.at(i));
      for (int64_t c = 0; c < r.C; ++c) {
        const int64_t at = k * r.C + c;  // logits_to_keep = C: the completion's positions only
        pt.logp.push_back(lp[at]);
        pt.entropy.push_back(en[at]);
        pt.mask.push_back(r.mask(i, c));
        if (!r.old_logp.empty()) pt.old_logp.push_back(r.old_logp.at(i).at(static_cast<size_t>(c)));
        if (!r.ref_logp.empty()) pt.ref_logp.push_back(r.ref_logp.at(i).at(static_cast<size_t>(c)));
      }
    }
    if (L.rloo) {
      if (pt.old_logp.empty()) pt.old_logp = pt.logp;  // the weights have not changed since generation: ρ = 1
      out.metrics = rloo_loss(L.epsilon_low, L.epsilon_high, micro_batches, pt);
    } else {
      GrpoLossOptions o = L.grpo;
      o.micro_batches = micro_batches;
      o.num_items_in_batch = r.num_items;
      out.metrics = grpo_loss(o, pt);
    }
    float* s = seed.mutable_data_as<float>();
    for (int64_t k = 0; k < B; ++k)
      for (int64_t c = 0; c < r.C; ++c) s[k * r.C + c] = static_cast<float>(L.share * out.metrics.d_logp[static_cast<size_t>(k * r.C + c)]);
    return L.share * out.metrics.loss;
  };
  TokenStepResult step = token_train_step(model, weights, programs, b, loss, L.gradient_checkpointing, L.temperature, r.C);
  out.loss = step.loss;
  out.grads = std::move(step.grads);
  return out;
}

}  // namespace trl

#include "train/online_step.h"

#include <algorithm>

#include "trl/core/error.h"

namespace trl {

namespace {
// Row indices 0, 1, ..., n − 1, and the rows of a round as int64 indices (Backend::copy_rows takes them so).
std::vector<int64_t> first_rows(size_t n) {
  std::vector<int64_t> r(n);
  for (size_t k = 0; k < n; ++k) r[k] = static_cast<int64_t>(k);
  return r;
}
std::vector<int64_t> as_rows(const std::vector<size_t>& rows) { return {rows.begin(), rows.end()}; }
}  // namespace

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

Tensor Rollout::completion_mask(const std::vector<size_t>& rows) const {
  Tensor m = Tensor::zeros(DType::F32, {static_cast<int64_t>(rows.size()), C});
  float* x = m.mutable_data_as<float>();
  for (size_t k = 0; k < rows.size(); ++k)
    for (int64_t c = 0; c < C; ++c) x[static_cast<int64_t>(k) * C + c] = static_cast<float>(mask(rows[k], c));
  return m;
}

Tensor logp_table(const std::vector<std::vector<float>>& rows, int64_t C) {
  if (rows.empty()) return {};
  Tensor t = Tensor::zeros(DType::F32, {static_cast<int64_t>(rows.size()), C});
  for (size_t i = 0; i < rows.size(); ++i) {
    if (static_cast<int64_t>(rows[i].size()) != C) fail("log-probs of row {}: {} values for {} completion positions", i, rows[i].size(), C);
    std::copy(rows[i].begin(), rows[i].end(), t.mutable_data_as<float>() + static_cast<int64_t>(i) * C);
  }
  return t;
}

std::vector<std::vector<float>> logp_rows(const Tensor& table) {
  if (table.numel() == 0) return {};
  const int64_t N = table.size(0), C = table.size(1);
  const float* x = table.data_as<float>();
  std::vector<std::vector<float>> out;
  for (int64_t i = 0; i < N; ++i) out.emplace_back(x + i * C, x + (i + 1) * C);
  return out;
}

Tensor rollout_logps(const Rollout& r, const std::vector<size_t>& which, int64_t batch, int32_t pad, Backend& backend,
                     const std::function<Tensor(const SFTBatch&)>& run) {
  Tensor out = backend.allocate(DType::F32, {static_cast<int64_t>(r.size()), r.C}, "rollout log-probs");
  backend.zero(out);
  for (size_t s = 0; s < which.size(); s += static_cast<size_t>(batch)) {
    const std::vector<size_t> rows(which.begin() + static_cast<int64_t>(s), which.begin() + static_cast<int64_t>(std::min(which.size(), s + static_cast<size_t>(batch))));
    const Tensor lp = run(rollout_batch(r, rows, pad));  // [rows, C]: logits_to_keep = C
    if (lp.shape() != Shape{static_cast<int64_t>(rows.size()), r.C}) fail("rollout_logps: {} log-probs for {} rows of {} completion positions", shape_str(lp.shape()), rows.size(), r.C);
    backend.copy_rows(lp, first_rows(rows.size()), out, as_rows(rows));
  }
  return out;
}

OnlineStepResult online_train_step(const CausalLM& model, const TensorMap& weights, ProgramCache& programs, const Rollout& r,
                                   const std::vector<size_t>& rows, const OnlineLoss& L, int64_t micro_batches, int32_t pad) {
  const SFTBatch b = rollout_batch(r, rows, pad);
  const int64_t B = static_cast<int64_t>(rows.size());
  Backend& backend = programs.backend();
  // The micro-batch's rows of the round's log-probs, gathered where they are.
  auto gathered = [&](const Tensor& table, const char* name) {
    if (table.numel() == 0) return Tensor();
    Tensor t = backend.allocate(DType::F32, {B, r.C}, name);
    backend.copy_rows(table, as_rows(rows), t, first_rows(rows.size()));
    return t;
  };
  const Tensor old_logp = gathered(r.old_logp, "old_logp"), ref_logp = gathered(r.ref_logp, "ref_logp");
  const Tensor mask = to_backend(backend, r.completion_mask(rows), "completion_mask");
  Backend::PolicyLossRequest q;
  q.rloo = L.rloo;
  if (L.rloo) {
    q.options.epsilon_low = L.epsilon_low, q.options.epsilon_high = L.epsilon_high;
  } else {
    q.options = L.grpo;
    q.options.num_items_in_batch = r.num_items;
  }
  q.options.micro_batches = micro_batches;
  q.share = L.share;
  q.mask = &mask;
  if (old_logp.numel() > 0) q.old_logp = &old_logp;
  if (ref_logp.numel() > 0) q.ref_logp = &ref_logp;
  for (size_t i : rows) q.advantages.push_back(r.advantages.at(i));
  OnlineStepResult out;
  const TokenLoss loss = [&](Backend& on, const Tensor& logps, const Tensor& entropy, Tensor& seed) {
    q.logp = &logps, q.entropy = &entropy;
    out.metrics = on.policy_loss(q, seed);
    return out.metrics.loss;
  };
  TokenStepResult step = token_train_step(model, weights, programs, b, loss, L.gradient_checkpointing, L.temperature, r.C, L.aux_weight);
  out.loss = step.loss + (step.aux_loss ? L.aux_weight * *step.aux_loss : 0.0);
  out.grads = std::move(step.grads);
  out.aux_loss = step.aux_loss;
  return out;
}

}  // namespace trl

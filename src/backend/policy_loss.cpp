#include "backend/policy_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "trl/backend/backend.h"
#include "trl/core/error.h"

namespace trl {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The nanmin / nanmax of TRL's metrics: NaN when every value is NaN.
double nan_extreme(const std::vector<double>& x, bool want_max) {
  double out = kNaN;
  for (double v : x)
    if (!std::isnan(v) && (std::isnan(out) || (want_max ? v > out : v < out))) out = v;
  return out;
}

// −min(c1·A, c2·A) with c1 = min(ρ, δ) (no cap without δ) and c2 = clamp(ρ, lo, hi), and its derivative with
// respect to ρ. As torch: clamp passes the gradient on its closed interval, and minimum splits it on a tie.
double clipped_surrogate(double rho, double A, double lo, double hi, std::optional<double> delta, double* d_rho) {
  const double c1 = delta ? std::min(rho, *delta) : rho, dc1 = delta && rho > *delta ? 0.0 : 1.0;
  const double c2 = std::clamp(rho, lo, hi), dc2 = rho >= lo && rho <= hi ? 1.0 : 0.0;
  const double a = c1 * A, b = c2 * A;
  const double da = dc1 * A, db = dc2 * A;
  *d_rho = -(a < b ? da : b < a ? db : 0.5 * (da + db));
  return -std::min(a, b);
}

void check_tokens(const PolicyTokens& t, bool need_old, bool need_ref, const char* who) {
  const size_t n = static_cast<size_t>(t.rows * t.length);
  if (t.logp.size() != n || t.mask.size() != n || t.advantages.size() != static_cast<size_t>(t.rows))
    fail("{}: a [{}, {}] batch needs {} log-probs and mask values and {} advantages", who, t.rows, t.length, n, t.rows);
  if ((need_old || !t.old_logp.empty()) && t.old_logp.size() != n) fail("{}: {} old log-probs for {} tokens", who, t.old_logp.size(), n);
  if (need_ref && t.ref_logp.size() != n) fail("{}: beta ≠ 0 needs the reference's log-probs ({} for {} tokens)", who, t.ref_logp.size(), n);
  if (!t.entropy.empty() && t.entropy.size() != n) fail("{}: {} entropies for {} tokens", who, t.entropy.size(), n);
}

// Σ x·m / Σ m over the batch (TRL's global_masked_mean for one process), 0 tokens: NaN is avoided with clamp(1).
double masked_mean(const std::vector<double>& x, const std::vector<double>& m) {
  double s = 0, c = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * m[i], c += m[i];
  return s / std::max(c, 1.0);
}

double mean(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

}  // namespace

TokenLossResult grpo_loss(const GrpoLossOptions& o, const PolicyTokens& t) {
  const bool sequence = o.importance_sampling_level == "sequence";
  if (!sequence && o.importance_sampling_level != "token")
    fail("importance_sampling_level '{}' is not token or sequence", o.importance_sampling_level);
  check_tokens(t, false, o.beta != 0, "grpo_loss");
  const int64_t B = t.rows, C = t.length;
  const double lo = 1 - o.epsilon_low, hi = 1 + o.epsilon_high, ga = static_cast<double>(std::max<int64_t>(1, o.micro_batches));
  auto old = [&](size_t i) { return t.old_logp.empty() ? t.logp[i] : t.old_logp[i]; };
  double mask_total = 0;
  std::vector<double> row_mask(static_cast<size_t>(B), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) row_mask[static_cast<size_t>(b)] += t.mask[static_cast<size_t>(b * C + c)];
  for (double m : row_mask) mask_total += m;
  // The weight of each token's ℓ·m in the loss, by loss_type.
  auto coef = [&](int64_t b) -> double {
    if (o.loss_type == "grpo") return 1.0 / (static_cast<double>(B) * std::max(row_mask[static_cast<size_t>(b)], 1.0) * ga);
    if (o.loss_type == "bnpo") return 1.0 / (std::max(mask_total, 1.0) * ga);
    if (o.loss_type == "dr_grpo") return 1.0 / (static_cast<double>(B) * static_cast<double>(o.max_completion_length) * ga);
    if (o.loss_type == "dapo") return 1.0 / std::max(o.num_items_in_batch, 1.0);
    fail("loss_type '{}' is not grpo, bnpo, dr_grpo or dapo", o.loss_type);
  };
  if (o.loss_type == "dr_grpo" && o.max_completion_length < 1) fail("grpo_loss: dr_grpo needs max_completion_length");
  TokenLossResult out;
  out.d_logp.assign(static_cast<size_t>(B * C), 0.0);
  std::vector<double> kl(static_cast<size_t>(B * C), 0.0), low(static_cast<size_t>(B * C), 0.0), high(low), region(low);
  std::vector<double> row_low(static_cast<size_t>(B)), row_high(static_cast<size_t>(B));
  double seq_low = 0, seq_high = 0, seq_region = 0;
  for (int64_t b = 0; b < B; ++b) {
    const double A = t.advantages[static_cast<size_t>(b)], cb = coef(b), M = row_mask[static_cast<size_t>(b)];
    // Sequence level: one ratio per row from the masked mean log-ratio.
    double seq_rho = 1, seq_d = 0, seq_value = 0;
    if (sequence) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = static_cast<size_t>(b * C + c);
        s += (t.logp[i] - old(i)) * t.mask[i];
      }
      seq_rho = std::exp(s / std::max(M, 1.0));
      seq_value = clipped_surrogate(seq_rho, A, lo, hi, o.delta, &seq_d);
      const double l = seq_rho < lo && A < 0, h = seq_rho > hi && A > 0;
      seq_low += l, seq_high += h, seq_region += (l || h);
      row_low[static_cast<size_t>(b)] = l, row_high[static_cast<size_t>(b)] = h;
    }
    double lows = 0, highs = 0;
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(b * C + c);
      const double m = t.mask[i];
      double value, d;
      if (sequence) {
        value = seq_value;
        // ℓ_b is shared by the row's tokens: its weight Σ_t cb·m_t = cb·M, through ρ = exp(mean log-ratio).
        d = m == 0 ? 0.0 : cb * M * seq_d * seq_rho / std::max(M, 1.0);
      } else {
        const double rho = std::exp(t.logp[i] - old(i));
        double d_rho;
        value = clipped_surrogate(rho, A, lo, hi, o.delta, &d_rho);
        d = cb * m * d_rho * rho;
        low[i] = rho < lo && A < 0, high[i] = rho > hi && A > 0, region[i] = low[i] != 0 || high[i] != 0;
        lows += low[i] * m, highs += high[i] * m;
      }
      if (o.beta != 0) {
        const double x = t.ref_logp[i] - t.logp[i];
        kl[i] = std::exp(x) - x - 1;
        value += o.beta * kl[i];
        d += cb * m * o.beta * (1 - std::exp(x));
      }
      out.loss += cb * m * value;
      out.d_logp[i] = d;
    }
    if (!sequence) row_low[static_cast<size_t>(b)] = lows / M, row_high[static_cast<size_t>(b)] = highs / M;  // 0/0 = NaN
  }
  out.entropy = t.entropy.empty() ? kNaN : masked_mean(t.entropy, t.mask);
  out.kl = o.beta != 0 ? masked_mean(kl, t.mask) : kNaN;
  if (sequence) {
    out.clip_low_mean = seq_low / std::max<double>(static_cast<double>(B), 1.0);
    out.clip_high_mean = seq_high / std::max<double>(static_cast<double>(B), 1.0);
    out.clip_region_mean = seq_region / std::max<double>(static_cast<double>(B), 1.0);
  } else {
    out.clip_low_mean = masked_mean(low, t.mask);
    out.clip_high_mean = masked_mean(high, t.mask);
    out.clip_region_mean = masked_mean(region, t.mask);
  }
  out.clip_low_min = nan_extreme(row_low, false);
  out.clip_high_max = nan_extreme(row_high, true);
  return out;
}

TokenLossResult rloo_loss(double epsilon_low, double epsilon_high, int64_t micro_batches, const PolicyTokens& t) {
  check_tokens(t, true, false, "rloo_loss");
  const int64_t B = t.rows, C = t.length;
  const double lo = 1 - epsilon_low, hi = 1 + epsilon_high;
  const double scale = 1.0 / (static_cast<double>(B) * static_cast<double>(std::max<int64_t>(1, micro_batches)));
  TokenLossResult out;
  out.d_logp.assign(static_cast<size_t>(B * C), 0.0);
  std::vector<double> low(static_cast<size_t>(B)), high(low), region(low);
  for (int64_t b = 0; b < B; ++b) {
    double lp = 0, old = 0;
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(b * C + c);
      lp += t.logp[i] * t.mask[i], old += t.old_logp[i] * t.mask[i];
    }
    const double A = t.advantages[static_cast<size_t>(b)], rho = std::exp(lp - old);
    double d_rho;
    out.loss += scale * clipped_surrogate(rho, A, lo, hi, std::nullopt, &d_rho);
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(b * C + c);
      out.d_logp[i] = scale * d_rho * rho * t.mask[i];
    }
    low[static_cast<size_t>(b)] = rho < lo && A < 0, high[static_cast<size_t>(b)] = rho > hi && A > 0;
    region[static_cast<size_t>(b)] = low[static_cast<size_t>(b)] != 0 || high[static_cast<size_t>(b)] != 0;
  }
  out.entropy = t.entropy.empty() ? kNaN : masked_mean(t.entropy, t.mask);
  out.kl = kNaN;  // RLOO's kl is a generation-time metric (old − ref)
  out.clip_low_mean = mean(low), out.clip_high_mean = mean(high), out.clip_region_mean = mean(region);
  out.clip_low_min = nan_extreme(low, false), out.clip_high_max = nan_extreme(high, true);
  return out;
}

namespace {
// The [B, C] f32 values of an optional tensor as doubles (empty for none).
std::vector<double> values_of(const Tensor* t) {
  if (t == nullptr) return {};
  const float* x = t->data_as<float>();
  return {x, x + t->numel()};
}
}  // namespace

void check_policy_loss_request(const Backend::PolicyLossRequest& q, const Tensor& seed) {
  if (q.logp == nullptr || q.mask == nullptr) fail("policy_loss: the log-probs and the loss mask are required");
  const Shape& s = q.logp->shape();
  if (s.size() != 2) fail("policy_loss: the log-probs must be [rows, completion positions], got {}", shape_str(s));
  const std::pair<const char*, const Tensor*> inputs[] = {
      {"log-probs", q.logp}, {"loss mask", q.mask}, {"entropy", q.entropy}, {"old log-probs", q.old_logp}, {"reference log-probs", q.ref_logp}, {"seed", &seed}};
  for (const auto& [what, t] : inputs)
    if (t != nullptr && (t->dtype() != DType::F32 || t->shape() != s || !t->is_contiguous()))
      fail("policy_loss: the {} must be contiguous f32 {} as the log-probs, got {} {}", what, shape_str(s), dtype_name(t->dtype()), shape_str(t->shape()));
  if (static_cast<int64_t>(q.advantages.size()) != s[0]) fail("policy_loss: {} advantages for {} rows", q.advantages.size(), s[0]);
  if (!q.rloo && q.options.beta != 0 && q.ref_logp == nullptr) fail("policy_loss: beta = {} needs the reference's log-probs", q.options.beta);
}

PolicyLossMetrics Backend::policy_loss(const PolicyLossRequest& q, Tensor& seed) {
  check_policy_loss_request(q, seed);
  PolicyTokens t;
  t.rows = q.logp->size(0), t.length = q.logp->size(1);
  t.logp = values_of(q.logp), t.mask = values_of(q.mask), t.entropy = values_of(q.entropy);
  t.old_logp = values_of(q.old_logp), t.ref_logp = values_of(q.ref_logp);
  t.advantages = q.advantages;
  TokenLossResult r;
  if (q.rloo) {
    if (t.old_logp.empty()) t.old_logp = t.logp;  // the weights have not changed since generation: ρ = 1
    r = rloo_loss(q.options.epsilon_low, q.options.epsilon_high, q.options.micro_batches, t);
  } else {
    r = grpo_loss(q.options, t);
  }
  float* s = seed.mutable_data_as<float>();
  for (size_t i = 0; i < r.d_logp.size(); ++i) s[i] = static_cast<float>(q.share * r.d_logp[i]);
  PolicyLossMetrics m = r;
  m.loss = q.share * r.loss;
  return m;
}

}  // namespace trl

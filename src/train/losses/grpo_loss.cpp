#include "train/losses/grpo_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "trl/core/error.h"

namespace trl {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// torch.isclose(std, 0): |std| <= 1e-8 (NaN is not close).
bool is_zero_std(double s) { return std::fabs(s) <= 1e-8; }

// The nanmin / nanmax of TRL's metrics: NaN when every value is NaN.
double nan_extreme(const std::vector<double>& x, bool want_max) {
  double out = kNaN;
  for (double v : x)
    if (!std::isnan(v) && (std::isnan(out) || (want_max ? v > out : v < out))) out = v;
  return out;
}

// Σ_f w_f·r_f over the non-NaN rewards of row i; NaN when every function gave None.
std::vector<double> weighted_sums(const std::vector<double>& rewards, int64_t F, const std::vector<double>& w) {
  const int64_t N = static_cast<int64_t>(rewards.size()) / F;
  std::vector<double> out(static_cast<size_t>(N), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    bool any = false;
    for (int64_t f = 0; f < F; ++f) {
      const double r = rewards[static_cast<size_t>(i * F + f)];
      if (std::isnan(r)) continue;
      any = true;
      out[static_cast<size_t>(i)] += w[static_cast<size_t>(f)] * r;
    }
    if (!any) out[static_cast<size_t>(i)] = kNaN;
  }
  return out;
}

std::vector<double> slice(const std::vector<double>& x, int64_t begin, int64_t count) {
  return {x.begin() + begin, x.begin() + begin + count};
}

void check_table(const std::vector<double>& rewards, int64_t F, const std::vector<double>& w, int64_t G, const char* who) {
  if (F < 1 || w.size() != static_cast<size_t>(F)) fail("{}: {} reward weights for {} reward functions", who, w.size(), F);
  if (G < 1 || rewards.size() % static_cast<size_t>(F * G) != 0)
    fail("{}: {} rewards are not whole groups of {} completions × {} functions", who, rewards.size(), G, F);
}

// The per-function and summed reward statistics every method logs.
void reward_stats(Advantages& a, const std::vector<double>& rewards, int64_t F, const std::vector<double>& w) {
  const int64_t N = static_cast<int64_t>(rewards.size()) / F;
  for (int64_t f = 0; f < F; ++f) {
    std::vector<double> col(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) col[static_cast<size_t>(i)] = rewards[static_cast<size_t>(i * F + f)];
    a.func_mean.push_back(nanmean(col));
    a.func_std.push_back(nanstd(col));
  }
  a.rewards = weighted_sums(rewards, F, w);
  a.reward_mean = nanmean(a.rewards);
  a.reward_std = nanstd(a.rewards);
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

}  // namespace

double nanmean(const std::vector<double>& x) {
  double s = 0;
  int64_t n = 0;
  for (double v : x)
    if (!std::isnan(v)) s += v, ++n;
  return n ? s / static_cast<double>(n) : kNaN;
}

double nanstd(const std::vector<double>& x) {
  const double mu = nanmean(x);
  double s = 0;
  int64_t n = 0;
  for (double v : x)
    if (!std::isnan(v)) s += (v - mu) * (v - mu), ++n;
  if (n == 0) return kNaN;
  // TRL: nanmean of the squared deviations times n / (n − 1); for n = 1 that is 0 · ∞ = NaN.
  const double bessel = static_cast<double>(n) / static_cast<double>(n - 1);
  return std::sqrt(s / static_cast<double>(n) * bessel);
}

Advantages grpo_advantages(const std::vector<double>& rewards, int64_t F, const std::vector<double>& w, int64_t G, const std::string& scale,
                           const std::string& aggregation) {
  check_table(rewards, F, w, G, "grpo_advantages");
  if (scale != "group" && scale != "batch" && scale != "none") fail("scale_rewards '{}' is not group, batch or none", scale);
  const int64_t N = static_cast<int64_t>(rewards.size()) / F;
  Advantages a;
  std::vector<double> adv(static_cast<size_t>(N)), stdev(static_cast<size_t>(N));
  if (aggregation == "sum_then_normalize") {
    const std::vector<double> r = weighted_sums(rewards, F, w);
    const double batch_std = N > 1 ? nanstd(r) : 0.0;
    for (int64_t g0 = 0; g0 < N; g0 += G) {
      const std::vector<double> grp = slice(r, g0, G);
      const double mu = nanmean(grp), sd = scale == "batch" ? batch_std : G > 1 ? nanstd(grp) : 0.0;
      for (int64_t i = g0; i < g0 + G; ++i) {
        adv[static_cast<size_t>(i)] = r[static_cast<size_t>(i)] - mu;
        if (scale != "none") adv[static_cast<size_t>(i)] /= sd + 1e-4;
        stdev[static_cast<size_t>(i)] = sd;
      }
    }
  } else if (aggregation == "normalize_then_sum") {
    // Each function normalised within its group, weighted and summed, then normalised over the batch.
    std::vector<double> r(static_cast<size_t>(N), 0.0);
    std::vector<char> scorable(static_cast<size_t>(N), 0);
    for (int64_t g0 = 0; g0 < N; g0 += G)
      for (int64_t f = 0; f < F; ++f) {
        std::vector<double> col;
        for (int64_t i = g0; i < g0 + G; ++i) col.push_back(rewards[static_cast<size_t>(i * F + f)]);
        const double mu = nanmean(col), sd = G > 1 ? nanstd(col) : 0.0;
        for (int64_t i = g0; i < g0 + G; ++i) {
          const double z = (col[static_cast<size_t>(i - g0)] - mu) / (sd + 1e-4);
          if (!std::isnan(z)) r[static_cast<size_t>(i)] += w[static_cast<size_t>(f)] * z;
          if (!std::isnan(col[static_cast<size_t>(i - g0)])) scorable[static_cast<size_t>(i)] = 1;
        }
      }
    for (int64_t i = 0; i < N; ++i)
      if (!scorable[static_cast<size_t>(i)]) r[static_cast<size_t>(i)] = kNaN;
    const double mu = nanmean(r), sd = N > 1 ? nanstd(r) : 0.0;
    for (int64_t i = 0; i < N; ++i) adv[static_cast<size_t>(i)] = (r[static_cast<size_t>(i)] - mu) / (sd + 1e-4), stdev[static_cast<size_t>(i)] = sd;
  } else {
    fail("multi_objective_aggregation '{}' is not sum_then_normalize or normalize_then_sum", aggregation);
  }
  int64_t zero = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (std::isnan(adv[static_cast<size_t>(i)])) adv[static_cast<size_t>(i)] = 0;
    zero += is_zero_std(stdev[static_cast<size_t>(i)]);
  }
  a.advantages = std::move(adv);
  a.frac_reward_zero_std = static_cast<double>(zero) / static_cast<double>(N);
  reward_stats(a, rewards, F, w);
  return a;
}

Advantages rloo_advantages(const std::vector<double>& rewards, int64_t F, const std::vector<double>& w, int64_t G, const std::vector<double>& kl,
                           double beta, std::optional<std::pair<double, double>> clip, bool normalize) {
  check_table(rewards, F, w, G, "rloo_advantages");
  const int64_t N = static_cast<int64_t>(rewards.size()) / F;
  if (beta != 0 && kl.size() != static_cast<size_t>(N)) fail("rloo_advantages: beta ≠ 0 needs {} KL values, got {}", N, kl.size());
  std::vector<double> r = weighted_sums(rewards, F, w);
  for (int64_t i = 0; i < N; ++i) {
    double& x = r[static_cast<size_t>(i)];
    if (clip) x = std::clamp(x, clip->first, clip->second);  // NaN stays NaN
    if (beta != 0) x -= beta * kl[static_cast<size_t>(i)];
  }
  Advantages a;
  std::vector<double> adv(static_cast<size_t>(N));
  int64_t zero = 0;
  for (int64_t g0 = 0; g0 < N; g0 += G) {
    const std::vector<double> grp = slice(r, g0, G);
    double sum = 0;
    int64_t count = 0;
    for (double v : grp)
      if (!std::isnan(v)) sum += v, ++count;
    const double sd = G > 1 ? nanstd(grp) : 0.0;
    for (int64_t i = g0; i < g0 + G; ++i) {
      const double ri = r[static_cast<size_t>(i)];
      // The leave-one-out baseline over the scorable siblings (0/0 = NaN for a lone scorable completion).
      adv[static_cast<size_t>(i)] = G > 1 ? ri - (sum - ri) / static_cast<double>(count - 1) : 0.0;
      zero += is_zero_std(sd);
    }
  }
  if (normalize) {
    const double mu = nanmean(adv), sd = nanstd(adv);
    for (double& x : adv) x = (x - mu) / (sd + 1e-4);
  }
  for (double& x : adv)
    if (std::isnan(x)) x = 0;
  a.advantages = std::move(adv);
  a.frac_reward_zero_std = static_cast<double>(zero) / static_cast<double>(N);
  reward_stats(a, rewards, F, w);
  return a;
}

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
  out.clip_low_mean = nanmean(low), out.clip_high_mean = nanmean(high), out.clip_region_mean = nanmean(region);
  out.clip_low_min = nan_extreme(low, false), out.clip_high_max = nan_extreme(high, true);
  return out;
}

}  // namespace trl

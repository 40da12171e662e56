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

}  // namespace trl

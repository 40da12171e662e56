// DPO losses written once over a number type: `double` for the value, `Dual` (value and one derivative) for the
// exact derivative with respect to one sequence log-prob at a time. A batch of N pairs costs 2N + 1 evaluations of
// O(N) scalars: nothing beside the forward and backward passes of the model.
#include "train/losses/dpo_loss.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include <fmt/ranges.h>

#include "train/losses/logistic.h"
#include "trl/core/error.h"

namespace trl {

namespace {

// A forward-mode dual number: v + d·ε with ε² = 0.
struct Dual {
  double v = 0, d = 0;
};
Dual operator+(Dual a, Dual b) { return {a.v + b.v, a.d + b.d}; }
Dual operator-(Dual a, Dual b) { return {a.v - b.v, a.d - b.d}; }
Dual operator*(Dual a, Dual b) { return {a.v * b.v, a.d * b.v + a.v * b.d}; }
Dual operator/(Dual a, Dual b) { return {a.v / b.v, (a.d * b.v - a.v * b.d) / (b.v * b.v)}; }
Dual operator-(Dual a) { return {-a.v, -a.d}; }
Dual exp(Dual a) { return {std::exp(a.v), std::exp(a.v) * a.d}; }
bool operator<(Dual a, Dual b) { return a.v < b.v; }
double exp(double a) { return std::exp(a); }
Dual lift(double x, Dual) { return {x, 0}; }
double lift(double x, double) { return x; }

// log σ(x) and σ(x) (train/losses/logistic.h) and their duals; max(x, 0); x².
using logistic::log_sigmoid;
using logistic::sigmoid;
Dual log_sigmoid(Dual x) { return {log_sigmoid(x.v), x.d / (1.0 + std::exp(x.v))}; }  // d/dx = σ(−x)
Dual sigmoid(Dual x) {
  const double s = sigmoid(x.v);
  return {s, s * (1 - s) * x.d};
}
double relu(double x) { return std::max(x, 0.0); }
Dual relu(Dual x) { return x.v > 0 ? x : Dual{0, 0}; }
template <class T>
T square(T x) {
  return x * x;
}
double clamp_max(double x, double hi) { return std::min(x, hi); }
Dual clamp_max(Dual x, double hi) { return x.v > hi ? Dual{hi, 0} : x; }

const std::vector<std::string>& loss_types() {
  static const std::vector<std::string> t = {"sigmoid", "hinge",     "ipo",      "exo_pair", "nca_pair", "robust", "bco_pair",    "sppo_hard",
                                             "aot",     "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft",    "sigmoid_norm"};
  return t;
}

// The score f(Δ) of the f-divergence.
template <class T>
T score(const DpoLossConfig& c, T logratio) {
  const std::string& f = c.f_divergence_type;
  if (f == "reverse_kl") return logratio;
  if (f == "forward_kl") return -exp(-logratio);
  if (f == "js_divergence") return log_sigmoid(logratio);
  // alpha_divergence: exp((α−1)Δ)/(α−1), the exponent clamped at 80 (TRL's f32 clamp); α = 1 is reverse_kl.
  const double a = c.f_alpha_divergence_coef;
  if (std::fabs(a - 1.0) < 1e-6) return logratio;
  const T t = clamp_max(lift(a - 1.0, logratio) * logratio, 80.0);
  return exp(t) * lift(1.0 / (a - 1.0), logratio);
}

// −(1−ε)·log σ(βx) − ε·log σ(−βx): aot's and aot_unpaired's per-pair term.
template <class T>
T smoothed_sigmoid(T x, double beta, double eps) {
  const T bx = lift(beta, x) * x;
  return -(lift(1 - eps, x) * log_sigmoid(bx)) - lift(eps, x) * log_sigmoid(-bx);
}

// The mean over pairs of one loss type (sft: its batch value), with c and r the policy's sequence log-probs.
template <class T>
T batch_loss(const DpoLossConfig& cfg, const std::string& type, const std::vector<T>& c, const std::vector<T>& r, const std::vector<DpoPair>& pairs) {
  const size_t n = pairs.size();
  const double beta = cfg.beta, eps = cfg.label_smoothing;
  const T zero = lift(0.0, c[0]);
  auto L = [&](double x) { return lift(x, c[0]); };
  if (type == "sft") {
    T sum = zero;
    double tokens = 0;
    for (size_t i = 0; i < n; ++i) sum = sum + c[i], tokens += static_cast<double>(pairs[i].chosen_tokens);
    return -sum / L(std::max(tokens, 1.0));
  }
  if (type == "aot" || type == "aot_unpaired") {
    std::vector<T> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      const T dc = c[i] - L(pairs[i].ref_chosen), dr = r[i] - L(pairs[i].ref_rejected);
      a[i] = type == "aot" ? c[i] - r[i] : dc;
      b[i] = type == "aot" ? L(pairs[i].ref_chosen - pairs[i].ref_rejected) : dr;
    }
    std::stable_sort(a.begin(), a.end());
    std::stable_sort(b.begin(), b.end());
    T sum = zero;
    for (size_t i = 0; i < n; ++i) sum = sum + smoothed_sigmoid(a[i] - b[i], beta, eps);
    return sum / L(static_cast<double>(n));
  }
  T sum = zero;
  for (size_t i = 0; i < n; ++i) {
    const T dc = c[i] - L(pairs[i].ref_chosen), dr = r[i] - L(pairs[i].ref_rejected);
    const T sc = score(cfg, dc), sr = score(cfg, dr), d = sc - sr, bd = L(beta) * d;
    const double nc = std::max<double>(static_cast<double>(pairs[i].chosen_tokens), 1.0);
    const double nr = std::max<double>(static_cast<double>(pairs[i].rejected_tokens), 1.0);
    T l = zero;
    if (type == "sigmoid") l = -log_sigmoid(bd);
    else if (type == "hinge") l = relu(L(1.0) - bd);
    else if (type == "ipo") l = square(sc / L(nc) - sr / L(nr) - L(1.0 / (2 * beta)));
    else if (type == "exo_pair")
      l = sigmoid(bd) * (log_sigmoid(bd) - L(std::log1p(-eps))) + sigmoid(-bd) * (log_sigmoid(-bd) - L(std::log(eps)));
    else if (type == "nca_pair")
      l = -log_sigmoid(L(beta) * sc) - L(0.5) * log_sigmoid(-(L(beta) * sc)) - L(0.5) * log_sigmoid(-(L(beta) * sr));
    else if (type == "robust") l = (-(L(1 - eps) * log_sigmoid(bd)) + L(eps) * log_sigmoid(-bd)) / L(1 - 2 * eps);
    else if (type == "bco_pair") l = -log_sigmoid(L(beta) * sc) - log_sigmoid(-(L(beta) * sr));
    else if (type == "sppo_hard") l = square(sc - L(0.5 / beta)) + square(sr + L(0.5 / beta));
    else if (type == "apo_zero") l = L(1.0) - sigmoid(L(beta) * dc) + sigmoid(L(beta) * dr);
    else if (type == "apo_down") l = sigmoid(L(beta) * dc) + L(1.0) - sigmoid(bd);
    else if (type == "discopop") {
      const T mod = sigmoid(bd / L(cfg.discopop_tau));
      l = -log_sigmoid(bd) * (L(1.0) - mod) + exp(-bd) * mod;
    } else if (type == "sigmoid_norm") l = -log_sigmoid(L(beta) * (sc / L(nc) - sr / L(nr)));
    else fail("dpo loss: unknown loss_type '{}'", type);
    sum = sum + l;
  }
  return sum / L(static_cast<double>(n));
}

template <class T>
T total_loss(const DpoLossConfig& cfg, const std::vector<T>& c, const std::vector<T>& r, const std::vector<DpoPair>& pairs) {
  T sum = lift(0.0, c[0]);
  for (size_t k = 0; k < cfg.loss_type.size(); ++k) {
    const double w = cfg.loss_weights.empty() ? 1.0 : cfg.loss_weights[k];
    sum = sum + lift(w, c[0]) * batch_loss(cfg, cfg.loss_type[k], c, r, pairs);
  }
  return sum;
}

}  // namespace

void validate(const DpoLossConfig& c) {
  if (c.loss_type.empty()) fail("loss_type: give at least one loss type ({})", fmt::join(loss_types(), ", "));
  for (const std::string& t : c.loss_type)
    if (std::find(loss_types().begin(), loss_types().end(), t) == loss_types().end())
      fail("loss_type: unknown loss type '{}' (one of {})", t, fmt::join(loss_types(), ", "));
  if (!c.loss_weights.empty() && c.loss_weights.size() != c.loss_type.size())
    fail("loss_weights: {} weights for {} loss types (give one per loss_type, or none for 1 each)", c.loss_weights.size(), c.loss_type.size());
  for (double w : c.loss_weights)
    if (!std::isfinite(w)) fail("loss_weights: {} is not a finite number", w);
  if (!(c.beta > 0) || !std::isfinite(c.beta)) fail("beta: {} must be a positive number", c.beta);
  if (!(c.label_smoothing >= 0 && c.label_smoothing <= 0.5)) fail("label_smoothing: {} must be in [0, 0.5]", c.label_smoothing);
  const auto uses = [&](const char* t) { return std::find(c.loss_type.begin(), c.loss_type.end(), t) != c.loss_type.end(); };
  if (uses("robust") && c.label_smoothing >= 0.5) fail("label_smoothing: the robust loss divides by 1 − 2·label_smoothing, so it must be below 0.5");
  if (uses("exo_pair") && !(c.label_smoothing > 0))
    fail("label_smoothing: the exo_pair loss takes log(label_smoothing), so it must be above 0 (TRL suggests 1e-3)");
  if (uses("discopop") && !(c.discopop_tau > 0)) fail("discopop_tau: {} must be positive", c.discopop_tau);
  static const std::vector<std::string> divergences = {"reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"};
  if (std::find(divergences.begin(), divergences.end(), c.f_divergence_type) == divergences.end())
    fail("f_divergence_type: unknown '{}' (one of {})", c.f_divergence_type, fmt::join(divergences, ", "));
}

DpoLoss dpo_loss(const DpoLossConfig& cfg, const std::vector<DpoPair>& pairs) {
  validate(cfg);
  if (pairs.empty()) fail("dpo loss: a batch needs at least one pair");
  const size_t n = pairs.size();
  DpoLoss out;
  std::vector<double> c(n), r(n);
  for (size_t i = 0; i < n; ++i) c[i] = pairs[i].chosen, r[i] = pairs[i].rejected;
  out.loss = total_loss(cfg, c, r, pairs);
  // One derivative at a time: seed one input's tangent with 1.
  std::vector<Dual> cd(n), rd(n);
  for (size_t i = 0; i < n; ++i) cd[i] = {c[i], 0}, rd[i] = {r[i], 0};
  out.d_chosen.resize(n);
  out.d_rejected.resize(n);
  for (size_t i = 0; i < n; ++i) {
    cd[i].d = 1;
    out.d_chosen[i] = total_loss(cfg, cd, rd, pairs).d;
    cd[i].d = 0;
    rd[i].d = 1;
    out.d_rejected[i] = total_loss(cfg, cd, rd, pairs).d;
    rd[i].d = 0;
  }
  for (size_t i = 0; i < n; ++i) {
    const double rc = cfg.beta * (pairs[i].chosen - pairs[i].ref_chosen), rr = cfg.beta * (pairs[i].rejected - pairs[i].ref_rejected);
    out.rewards_chosen += rc / static_cast<double>(n);
    out.rewards_rejected += rr / static_cast<double>(n);
    out.rewards_accuracies += (rc > rr ? 1.0 : 0.0) / static_cast<double>(n);
    out.rewards_margins += (rc - rr) / static_cast<double>(n);
    out.logps_chosen += pairs[i].chosen / static_cast<double>(n);
    out.logps_rejected += pairs[i].rejected / static_cast<double>(n);
  }
  return out;
}

}  // namespace trl

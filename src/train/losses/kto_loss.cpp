#include "train/losses/kto_loss.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "train/losses/logistic.h"
#include "trl/core/error.h"

namespace trl {

namespace {
using logistic::sigmoid;
double round2(double x) { return std::round(x * 100.0) / 100.0; }
}  // namespace

void validate(const KtoLossConfig& c) {
  if (c.loss_type != "kto" && c.loss_type != "apo_zero_unpaired")
    fail("loss_type: unknown KTO loss type '{}' (one of kto, apo_zero_unpaired)", c.loss_type);
  if (!(c.beta > 0) || !std::isfinite(c.beta)) fail("beta: {} must be a positive number", c.beta);
  if (!(c.desirable_weight > 0) || !std::isfinite(c.desirable_weight)) fail("desirable_weight: {} must be a positive number", c.desirable_weight);
  if (!(c.undesirable_weight > 0) || !std::isfinite(c.undesirable_weight))
    fail("undesirable_weight: {} must be a positive number", c.undesirable_weight);
}

KtoLoss kto_loss(const KtoLossConfig& cfg, const std::vector<KtoRow>& rows, double kl) {
  validate(cfg);
  if (rows.empty()) fail("kto loss: a batch needs at least one row");
  const double n = static_cast<double>(rows.size()), beta = cfg.beta;
  const bool kto = cfg.loss_type == "kto";
  KtoLoss out;
  out.kl = kto ? kl : 0.0;
  out.d_logp.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const KtoRow& r = rows[i];
    const double ratio = r.logp - r.ref_logp;
    // The sigmoid's argument a and the row's loss as w·(1 − σ(a)) (or w·σ(a) for an undesirable apo row).
    const double w = r.desirable ? cfg.desirable_weight : cfg.undesirable_weight;
    double l = 0, dl = 0;  // loss and dloss/dratio
    if (r.desirable) {
      const double a = beta * (ratio - out.kl), s = sigmoid(a);
      l = w * (1 - s), dl = -w * s * (1 - s) * beta;
    } else if (kto) {
      const double a = beta * (out.kl - ratio), s = sigmoid(a);
      l = w * (1 - s), dl = w * s * (1 - s) * beta;
    } else {
      const double a = beta * ratio, s = sigmoid(a);
      l = w * s, dl = w * s * (1 - s) * beta;
    }
    out.loss += l / n;
    out.d_logp[i] = dl / n;
    if (r.desirable) {
      ++out.num_chosen, out.rewards_chosen += beta * ratio, out.logps_chosen += r.logp;
    } else {
      ++out.num_rejected, out.rewards_rejected += beta * ratio, out.logps_rejected += r.logp;
    }
  }
  if (out.num_chosen) out.rewards_chosen /= static_cast<double>(out.num_chosen), out.logps_chosen /= static_cast<double>(out.num_chosen);
  if (out.num_rejected) out.rewards_rejected /= static_cast<double>(out.num_rejected), out.logps_rejected /= static_cast<double>(out.num_rejected);
  if (out.num_chosen && out.num_rejected) out.rewards_margins = out.rewards_chosen - out.rewards_rejected;
  return out;
}

double kto_kl_estimate(const std::vector<double>& kl_logp, const std::vector<double>& kl_ref_logp) {
  if (kl_logp.size() != kl_ref_logp.size() || kl_logp.empty())
    fail("kto KL estimate: {} policy and {} reference log-probs (need the same number, at least one)", kl_logp.size(), kl_ref_logp.size());
  double mean = 0;
  for (size_t i = 0; i < kl_logp.size(); ++i) mean += (kl_logp[i] - kl_ref_logp[i]) / static_cast<double>(kl_logp.size());
  return std::max(mean, 0.0);
}

std::string kto_weight_warning(const KtoLossConfig& c, int64_t num_desirable, int64_t num_undesirable) {
  const double d = static_cast<double>(std::max<int64_t>(num_desirable, 1)), u = static_cast<double>(std::max<int64_t>(num_undesirable, 1));
  if (d == u) return "";
  const double des_lo = round2(u * c.undesirable_weight / d), des_hi = round2(u * c.undesirable_weight / d * 1.33);
  const double und_lo = round2(d * c.desirable_weight / u / 1.33), und_hi = round2(d * c.desirable_weight / u);
  const bool des_ok = des_lo <= c.desirable_weight && c.desirable_weight <= des_hi;
  const bool und_ok = und_lo <= c.undesirable_weight && c.undesirable_weight <= und_hi;
  if (des_ok || und_ok) return "";
  return fmt::format(
      "the dataset has {} desirable and {} undesirable examples, and the weights are outside the range KTO recommends for "
      "that balance: set EITHER desirable_weight in [{}, {}] or undesirable_weight in [{}, {}] (but not both)",
      num_desirable, num_undesirable, des_lo, des_hi, und_lo, und_hi);
}

}  // namespace trl

// The reference backend's mixture-of-experts ops (graph::Op::MoeTopK ... MoeAuxLossBackward): each token's experts
// computed one (token, choice) at a time in f64, rounding where Transformers' eager Qwen3-MoE rounds (each
// projection's output, silu, the product), so that a bf16 model is emulated; the backward passes in f64 throughout.
#include "backend/reference/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/reference/rounding.h"
#include "trl/core/error.h"

namespace trl::reference {

namespace {

double at(const Tensor& t, int64_t i) { return load_element(t.data(), t.dtype(), i); }
void put(Tensor& t, int64_t i, double v) { store_element(t.mutable_data(), t.dtype(), i, v); }

// softmax of row n of logits [N, E], in f64.
std::vector<double> softmax_row(const Tensor& logits, int64_t n) {
  const int64_t E = logits.size(1);
  std::vector<double> p(static_cast<size_t>(E));
  double mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, at(logits, n * E + e));
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += p[static_cast<size_t>(e)] = std::exp(at(logits, n * E + e) - mx);
  for (double& v : p) v /= sum;
  return p;
}

int32_t expert_at(const Tensor& experts, int64_t i, int64_t E, const char* op) {
  const int32_t e = experts.data_as<int32_t>()[i];
  if (e < 0 || e >= E) fail("{}: expert {} at flat position {} is outside [0, {})", op, e, i, E);
  return e;
}

// The local index of choice i under expert parallel (experts [first, first + E) of `total`, 0: E), or -1 for
// another rank's expert.
int64_t local_expert(const Tensor& experts, int64_t i, int64_t E, int64_t first, int64_t total, const char* op) {
  const int64_t e = expert_at(experts, i, total > 0 ? total : E, op) - first;
  return e >= 0 && e < E ? e : -1;
}

bool counted(const Tensor* mask, int64_t n) { return mask == nullptr || mask->data_as<int32_t>()[n] != 0; }

// One expert's forward on one token, with its intermediate values (the backward reuses them).
struct ExpertPass {
  std::vector<double> g, u, a, o;  // gate and up outputs [F], the activation [F], the output [C]
};
ExpertPass expert_forward(const Tensor& x, int64_t n, int32_t e, const Tensor& gate_up, const Tensor& down) {
  const int64_t C = x.size(1), F = gate_up.size(1) / 2;
  const DType dt = x.dtype();
  ExpertPass p;
  p.g.resize(static_cast<size_t>(F));
  p.u.resize(static_cast<size_t>(F));
  p.a.resize(static_cast<size_t>(F));
  p.o.resize(static_cast<size_t>(C));
  const int64_t gu = static_cast<int64_t>(e) * 2 * F * C, dn = static_cast<int64_t>(e) * C * F;
  for (int64_t f = 0; f < F; ++f) {
    double sg = 0, su = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xv = at(x, n * C + c);
      sg += xv * at(gate_up, gu + f * C + c);
      su += xv * at(gate_up, gu + (F + f) * C + c);
    }
    const double g = rnd(dt, sg), u = rnd(dt, su);
    p.g[static_cast<size_t>(f)] = g;
    p.u[static_cast<size_t>(f)] = u;
    p.a[static_cast<size_t>(f)] = rnd(dt, rnd(dt, g / (1.0 + std::exp(-g))) * u);
  }
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int64_t f = 0; f < F; ++f) s += p.a[static_cast<size_t>(f)] * at(down, dn + c * F + f);
    p.o[static_cast<size_t>(c)] = rnd(dt, s);
  }
  return p;
}

}  // namespace

void moe_topk(const Tensor& logits, Tensor& out) {
  const int64_t N = logits.size(0), E = logits.size(1), K = out.size(1);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return at(logits, n * E + a) > at(logits, n * E + b); });
    for (int64_t k = 0; k < K; ++k) out.mutable_data_as<int32_t>()[n * K + k] = order[static_cast<size_t>(k)];
  }
}

void moe_route_weights(const Tensor& logits, const Tensor& experts, bool normalize, Tensor& out) {
  const int64_t N = logits.size(0), E = logits.size(1), K = experts.size(1);
  for (int64_t n = 0; n < N; ++n) {
    const std::vector<double> p = softmax_row(logits, n);
    double sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += p[static_cast<size_t>(expert_at(experts, n * K + k, E, "moe_route_weights"))];
    for (int64_t k = 0; k < K; ++k) {
      const double w = p[static_cast<size_t>(expert_at(experts, n * K + k, E, "moe_route_weights"))];
      put(out, n * K + k, normalize ? w / sum : w);
    }
  }
}

// out[n] = Σ_k weights[n,k]·expert(x_n), each term rounded to x's dtype as Transformers' eager model rounds it, the
// sum once.
void moe_experts(const Tensor& x, const Tensor& experts, const Tensor& weights, const Tensor& gate_up, const Tensor& down, int64_t first,
                 int64_t total, Tensor& out) {
  const int64_t N = x.size(0), C = x.size(1), K = experts.size(1), E = gate_up.size(0);
  const DType dt = x.dtype();
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> y(static_cast<size_t>(C), 0.0);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = local_expert(experts, n * K + k, E, first, total, "moe_experts");
      if (e < 0) continue;  // another rank's expert
      const ExpertPass p = expert_forward(x, n, static_cast<int32_t>(e), gate_up, down);
      const double w = rnd(dt, at(weights, n * K + k));
      for (int64_t c = 0; c < C; ++c) y[static_cast<size_t>(c)] += rnd(dt, p.o[static_cast<size_t>(c)] * w);
    }
    for (int64_t c = 0; c < C; ++c) put(out, n * C + c, y[static_cast<size_t>(c)]);
  }
}

void moe_router_stats(const Tensor& logits, const Tensor& experts, const Tensor* mask, Tensor& out) {
  const int64_t N = logits.size(0), E = logits.size(1), K = experts.size(1);
  std::vector<double> s(static_cast<size_t>(2 * E + 1), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (!counted(mask, n)) continue;
    const std::vector<double> p = softmax_row(logits, n);
    for (int64_t k = 0; k < K; ++k) s[static_cast<size_t>(expert_at(experts, n * K + k, E, "moe_router_stats"))] += 1;
    for (int64_t e = 0; e < E; ++e) s[static_cast<size_t>(E + e)] += p[static_cast<size_t>(e)];
    s[static_cast<size_t>(2 * E)] += 1;
  }
  for (int64_t i = 0; i < 2 * E + 1; ++i) put(out, i, s[static_cast<size_t>(i)]);
}

void moe_aux_loss(const Tensor& stats, Tensor& out) {
  const int64_t E = (stats.numel() - 1) / 2;
  const double tokens = at(stats, 2 * E);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += at(stats, e) * at(stats, E + e);
  put(out, 0, tokens > 0 ? static_cast<double>(E) * sum / (tokens * tokens) : 0.0);
}

// w_k = p[e_k] (/ S, S = Σ_k p[e_k]); dp[e_k] += ∂w/∂p · dw; dl[j] = p[j]·(dp[j] − Σ_e dp[e]·p[e]).
void moe_route_weights_backward(const Tensor& logits, const Tensor& experts, const Tensor& dweights, bool normalize, Tensor& out) {
  const int64_t N = logits.size(0), E = logits.size(1), K = experts.size(1);
  for (int64_t n = 0; n < N; ++n) {
    const std::vector<double> p = softmax_row(logits, n);
    double S = 0, dot = 0;  // S = Σ_k p[e_k], dot = Σ_k dw_k·p[e_k]
    for (int64_t k = 0; k < K; ++k) {
      const double pk = p[static_cast<size_t>(expert_at(experts, n * K + k, E, "moe_route_weights_backward"))];
      S += pk;
      dot += at(dweights, n * K + k) * pk;
    }
    std::vector<double> dp(static_cast<size_t>(E), 0.0);
    for (int64_t k = 0; k < K; ++k) {
      const size_t e = static_cast<size_t>(experts.data_as<int32_t>()[n * K + k]);
      dp[e] += normalize ? at(dweights, n * K + k) / S - dot / (S * S) : at(dweights, n * K + k);
    }
    double mix = 0;
    for (int64_t e = 0; e < E; ++e) mix += dp[static_cast<size_t>(e)] * p[static_cast<size_t>(e)];
    for (int64_t j = 0; j < E; ++j) put(out, n * E + j, p[static_cast<size_t>(j)] * (dp[static_cast<size_t>(j)] - mix));
  }
}

// Packed [dx | dweights | dgate_up | ddown] (the last two absent with dh_only).
void moe_experts_backward(const Tensor& x, const Tensor& experts, const Tensor& weights, const Tensor& gate_up, const Tensor& down,
                          const Tensor& dy, bool dh_only, int64_t first, int64_t total, Tensor& out) {
  const int64_t N = x.size(0), C = x.size(1), K = experts.size(1), E = gate_up.size(0), F = gate_up.size(1) / 2;
  const int64_t nx = N * C, nw = N * K, ng = E * 2 * F * C;
  std::vector<double> dx(static_cast<size_t>(nx), 0.0), dw(static_cast<size_t>(nw), 0.0);
  std::vector<double> dgu(dh_only ? 0 : static_cast<size_t>(ng), 0.0), ddn(dh_only ? 0 : static_cast<size_t>(E * C * F), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t local = local_expert(experts, n * K + k, E, first, total, "moe_experts_backward");
      if (local < 0) continue;  // another rank's expert: nothing here, a zero dweight
      const int32_t e = static_cast<int32_t>(local);
      const ExpertPass p = expert_forward(x, n, e, gate_up, down);
      const double w = at(weights, n * K + k);
      const int64_t gu = static_cast<int64_t>(e) * 2 * F * C, dn = static_cast<int64_t>(e) * C * F;
      std::vector<double> dout(static_cast<size_t>(C));
      double dwk = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double g = at(dy, n * C + c);
        dwk += g * p.o[static_cast<size_t>(c)];
        dout[static_cast<size_t>(c)] = g * w;
      }
      dw[static_cast<size_t>(n * K + k)] += dwk;
      for (int64_t f = 0; f < F; ++f) {
        double da = 0;
        for (int64_t c = 0; c < C; ++c) {
          da += dout[static_cast<size_t>(c)] * at(down, dn + c * F + f);
          if (!dh_only) ddn[static_cast<size_t>(dn + c * F + f)] += dout[static_cast<size_t>(c)] * p.a[static_cast<size_t>(f)];
        }
        const double g = p.g[static_cast<size_t>(f)], u = p.u[static_cast<size_t>(f)], sig = 1.0 / (1.0 + std::exp(-g));
        const double dg = da * u * sig * (1.0 + g * (1.0 - sig)), du = da * g * sig;
        for (int64_t c = 0; c < C; ++c) {
          const double xv = at(x, n * C + c);
          dx[static_cast<size_t>(n * C + c)] += dg * at(gate_up, gu + f * C + c) + du * at(gate_up, gu + (F + f) * C + c);
          if (!dh_only) {
            dgu[static_cast<size_t>(gu + f * C + c)] += dg * xv;
            dgu[static_cast<size_t>(gu + (F + f) * C + c)] += du * xv;
          }
        }
      }
    }
  }
  int64_t o = 0;
  for (double v : dx) put(out, o++, v);
  for (double v : dw) put(out, o++, v);
  for (double v : dgu) put(out, o++, v);
  for (double v : ddn) put(out, o++, v);
}

void moe_router_stats_backward(const Tensor& logits, const Tensor* mask, const Tensor& dstats, Tensor& out) {
  const int64_t N = logits.size(0), E = logits.size(1);
  for (int64_t n = 0; n < N; ++n) {
    if (!counted(mask, n)) {
      for (int64_t j = 0; j < E; ++j) put(out, n * E + j, 0.0);
      continue;
    }
    const std::vector<double> p = softmax_row(logits, n);
    double mix = 0;
    for (int64_t e = 0; e < E; ++e) mix += at(dstats, E + e) * p[static_cast<size_t>(e)];
    for (int64_t j = 0; j < E; ++j) put(out, n * E + j, p[static_cast<size_t>(j)] * (at(dstats, E + j) - mix));
  }
}

void moe_aux_loss_backward(const Tensor& stats, const Tensor& dloss, Tensor& out) {
  const int64_t E = (stats.numel() - 1) / 2;
  const double tokens = at(stats, 2 * E), g = at(dloss, 0);
  for (int64_t i = 0; i < 2 * E + 1; ++i) {
    const bool prob = i >= E && i < 2 * E;
    put(out, i, prob && tokens > 0 ? g * static_cast<double>(E) * at(stats, i - E) / (tokens * tokens) : 0.0);
  }
}

void batched_matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, Tensor& out) {
  const int64_t E = out.size(0), M = out.size(1), N = out.size(2), K = trans_a ? a.size(1) : a.size(2);
  const int64_t ar = a.size(1), ac = a.size(2), br = b.size(1), bc = b.size(2);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double sum = 0;
        for (int64_t k = 0; k < K; ++k)
          sum += at(a, e * ar * ac + (trans_a ? k * ac + m : m * ac + k)) * at(b, e * br * bc + (trans_b ? n * bc + k : k * bc + n));
        put(out, (e * M + m) * N + n, sum);
      }
}

}  // namespace trl::reference

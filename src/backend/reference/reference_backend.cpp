// The reference backend: obviously correct loops that run any graph. It is the oracle every optimised kernel is
// tested against, so it favours clarity over speed: f64 accumulation, and rounding to the value's dtype at the
// points where Transformers' eager Qwen3 rounds (so a bf16 model is emulated faithfully).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "backend/reference/moe.h"
#include "backend/reference/rounding.h"
#include "backend/vocab_parallel.h"
#include "core/rng.h"
#include "trl/backend/backend.h"
#include "trl/core/collectives.h"
#include "trl/core/error.h"
#include "graph/passes.h"

namespace trl {

namespace {

using graph::Graph;
using graph::kNone;
using graph::Node;
using graph::Op;

using reference::rnd;  // a value as storing it in a dtype keeps it

// Every element as double: exact for every float dtype, f64 included (gradient checks run in f64).
std::vector<double> as_f64(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::F32) {
    const float* p = t.data_as<float>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = p[i];
  } else {
    for (size_t i = 0; i < v.size(); ++i) v[i] = load_element(t.data(), t.dtype(), static_cast<int64_t>(i));
  }
  return v;
}

// ids:[B,T] i32, table:[V,C] -> out:[B,T,C]; under a vocabulary split, zeros for the ids other ranks hold.
void embedding(const Tensor& ids, const Tensor& table, const graph::VocabSplit& split, Tensor& out) {
  const int64_t V = table.size(0), C = table.size(1), whole = whole_vocab(split, V);
  const int32_t* id = ids.data_as<int32_t>();
  void* o = out.mutable_data();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (id[i] < 0 || id[i] >= whole) fail("embedding: token id {} at flat position {} is out of range for a vocabulary of {}", id[i], i, whole);
    const int32_t row = local_target(split, id[i]);
    if (row < 0 || row >= V) continue;  // out is zero-filled
    for (int64_t c = 0; c < C; ++c) store_element(o, out.dtype(), i * C + c, load_element(table.data(), table.dtype(), row * C + c));
  }
}

// x:[M,K], w:[N,K], bias:[N] or none, addend:[M,N] or none -> out:[M,N] (rounded once)
void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor* addend, Tensor& out) {
  const int64_t K = x.size(-1), M = x.numel() / std::max<int64_t>(K, 1), N = w.size(0);
  const std::vector<double> wf = as_f64(w);
  const std::vector<double> xf = as_f64(x);
  std::vector<double> bf = bias ? as_f64(*bias) : std::vector<double>();
  void* o = out.mutable_data();
  for (int64_t m = 0; m < M; ++m) {
    const double* xr = xf.data() + m * K;
    for (int64_t n = 0; n < N; ++n) {
      const double* wr = wf.data() + n * K;
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(xr[k]) * wr[k];
      if (bias) acc += bf[static_cast<size_t>(n)];
      if (addend) acc += load_element(addend->data(), addend->dtype(), m * N + n);
      store_element(o, out.dtype(), m * N + n, acc);
    }
  }
}

// x:[R,C], w:[C] -> out:[R,C].  y = w · cast(x / sqrt(mean(x²) + eps)), the cast being to x's dtype.
void rms_norm(const Tensor& x, const Tensor& w, double eps, Tensor& out) {
  const int64_t C = x.size(-1), R = x.numel() / std::max<int64_t>(C, 1);
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) {
      double v = load_element(x.data(), x.dtype(), r * C + c);
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c) {
      double y = rnd(x.dtype(), load_element(x.data(), x.dtype(), r * C + c) * inv);
      store_element(out.mutable_data(), out.dtype(), r * C + c, y * load_element(w.data(), w.dtype(), c));
    }
  }
}

// x:[B,T,H,D], positions:[B,T] -> out:[B,T,H,D].  out = x·cos + rotate_half(x)·sin, rotate_half(x) = [-x2, x1].
// cos/sin follow Transformers: angle = f32(pos · inv_freq) in f32, cos/sin rounded to the activation dtype.
void rope(const Tensor& x, const Tensor& positions, const graph::Attrs& a, Tensor& out) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  const DType dt = x.dtype();
  const int32_t* pos = positions.data_as<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float p = static_cast<float>(pos[b * T + t]);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * T + t) * H + h) * D;
        for (int64_t j = 0; j < D; ++j) {
          const float angle = p * a.inv_freq[static_cast<size_t>(j % half)];
          const double c = rnd(dt, std::cos(static_cast<double>(angle)) * a.rope_scaling);
          const double s = rnd(dt, std::sin(static_cast<double>(angle)) * a.rope_scaling) * (a.inverse ? -1.0 : 1.0);
          const double xj = load_element(x.data(), dt, base + j);
          const double rot = j < half ? -load_element(x.data(), dt, base + j + half) : load_element(x.data(), dt, base + j - half);
          store_element(out.mutable_data(), out.dtype(), base + j, rnd(dt, xj * c) + rnd(dt, rot * s));
        }
      }
    }
  }
}

// The key mask holds segment ids: 0 is padding, and a query sees a key only within its own segment (packed
// sequences never attend to each other). A plain 0/1 padding mask is the one-segment case.
bool visible(const Tensor* mask, int64_t b, int64_t S, int64_t query_pos, int64_t key_pos) {
  if (mask == nullptr) return true;
  const int32_t* m = mask->data_as<int32_t>();
  return m[b * S + key_pos] != 0 && m[b * S + key_pos] == m[b * S + query_pos];
}

// q:[B,T,H,D], k,v:[B,S,Hkv,D], key_mask:[B,S] or none -> out:[B,T,H,D]
// Query t sits at key index t + (S - T); with `causal` it sees keys 0..that index whose mask is 1. A query that
// sees no key at all (a padding row) gets zeros. As in Transformers' eager attention, the scores q·kᵀ, the scaled
// scores and the probabilities are stored in the activation dtype (softmax itself runs in higher precision).
// With cache_rows [B] (and q_pos), k,v hold any number of cache rows and query row b reads row cache_rows[b].
void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask, const Tensor* q_pos, const Tensor* cache_rows,
               const graph::Attrs& a, Tensor& out) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1), Hkv = k.size(2);
  const int64_t rep = H / Hkv, offset = S - T;
  const std::vector<double> qf = as_f64(q), kf = as_f64(k), vf = as_f64(v);
  std::vector<double> p(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t kr_row = cache_rows ? cache_rows->data_as<int32_t>()[b] : b;
    if (kr_row < 0 || kr_row >= k.size(0)) fail("attention: cache row {} (query row {}) is outside the cache's {} rows", kr_row, b, k.size(0));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / rep;
      for (int64_t t = 0; t < T; ++t) {
        const double* qr = qf.data() + ((b * T + t) * H + h) * D;
        // The query's key index: given (a static KV cache's cache position) or t + S - T.
        const int64_t qp = q_pos ? q_pos->data_as<int32_t>()[b * T + t] : t + offset;
        if (qp < 0 || qp >= S) fail("attention: query position {} (row {}, token {}) is outside the {} keys", qp, b, t, S);
        double mx = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          bool allowed = (!a.causal || s <= qp) && visible(mask, b, S, qp, s);
          if (!allowed) {
            p[static_cast<size_t>(s)] = -INFINITY;
            continue;
          }
          const double* kr = kf.data() + ((kr_row * S + s) * Hkv + hk) * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qr[d]) * kr[d];
          p[static_cast<size_t>(s)] = rnd(q.dtype(), rnd(q.dtype(), dot) * a.scale);
          mx = std::max(mx, p[static_cast<size_t>(s)]);
        }
        const int64_t obase = ((b * T + t) * H + h) * D;
        if (mx == -INFINITY) {
          for (int64_t d = 0; d < D; ++d) store_element(out.mutable_data(), out.dtype(), obase + d, 0.0);
          continue;
        }
        double sum = 0;
        for (int64_t s = 0; s < S; ++s) {
          double e = p[static_cast<size_t>(s)] == -INFINITY ? 0.0 : std::exp(p[static_cast<size_t>(s)] - mx);
          p[static_cast<size_t>(s)] = e;
          sum += e;
        }
        for (int64_t s = 0; s < S; ++s) p[static_cast<size_t>(s)] = rnd(q.dtype(), p[static_cast<size_t>(s)] / sum);
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t s = 0; s < S; ++s) {
            if (p[static_cast<size_t>(s)] != 0) acc += p[static_cast<size_t>(s)] * vf[static_cast<size_t>(((kr_row * S + s) * Hkv + hk) * D + d)];
          }
          store_element(out.mutable_data(), out.dtype(), obase + d, acc);
        }
      }
    }
  }
}

// gate,up:[...,F] -> silu(gate)·up, with silu's result rounded to the dtype first (as an eager bf16 model does).
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const double g = load_element(gate.data(), gate.dtype(), i);
    const double s = rnd(gate.dtype(), g / (1.0 + std::exp(-g)));
    store_element(out.mutable_data(), out.dtype(), i, s * load_element(up.data(), up.dtype(), i));
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  for (int64_t i = 0; i < a.numel(); ++i) {
    store_element(out.mutable_data(), out.dtype(), i, load_element(a.data(), a.dtype(), i) + load_element(b.data(), b.dtype(), i));
  }
}

// ---- training ops ----

// Row r of the logits h·wᵀ (rounded to `dtype`, as a bf16 model's lm_head output is before Transformers upcasts
// it for the loss) into z; returns log Σ exp(z).
double row_logits(const std::vector<double>& hf, const std::vector<double>& wf, int64_t r, int64_t C, int64_t V, DType dtype,
                  std::vector<double>& z) {
  double mx = -INFINITY;
  for (int64_t v = 0; v < V; ++v) {
    double acc = 0;
    for (int64_t c = 0; c < C; ++c) acc += hf[static_cast<size_t>(r * C + c)] * wf[static_cast<size_t>(v * C + c)];
    z[static_cast<size_t>(v)] = rnd(dtype, acc);
    mx = std::max(mx, z[static_cast<size_t>(v)]);
  }
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(z[static_cast<size_t>(v)] - mx);
  return mx + std::log(sum);
}

// The whole vocabulary's statistics of every row of the logits h·wᵀ: lse, the entropy H and, with targets,
// log p(target) and whether the target is the first argmax. Under a vocabulary split (graph::VocabSplit) w is this
// rank's rows and targets are of the whole vocabulary: the rows' statistics over w are combined over the group.
struct RowStats {
  std::vector<double> lse, entropy, logp, match;
};
RowStats row_stats(const Tensor& h, const Tensor& w, const Tensor* targets, const graph::VocabSplit& split, const char* what) {
  const int64_t C = h.size(-1), R = h.numel() / std::max<int64_t>(C, 1), V = w.size(0), whole = whole_vocab(split, V);
  const std::vector<double> hf = as_f64(h), wf = as_f64(w);
  const int32_t* t = targets ? targets->data_as<int32_t>() : nullptr;
  std::vector<double> z(static_cast<size_t>(V));
  RowStats s{std::vector<double>(static_cast<size_t>(R)), std::vector<double>(static_cast<size_t>(R)), std::vector<double>(static_cast<size_t>(R)),
             std::vector<double>(static_cast<size_t>(R))};
  std::vector<double> mx(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const size_t i = static_cast<size_t>(r);
    s.lse[i] = row_logits(hf, wf, r, C, V, h.dtype(), z);
    for (int64_t v = 0; v < V; ++v) s.entropy[i] += std::exp(z[static_cast<size_t>(v)] - s.lse[i]) * z[static_cast<size_t>(v)];  // Σ p·z
    const auto best = std::max_element(z.begin(), z.end()) - z.begin();
    mx[i] = z[static_cast<size_t>(best)];
    if (!t) continue;
    if (t[r] < 0 || t[r] >= whole) fail("{}: target {} at row {} is outside the vocabulary [0, {})", what, t[r], r, whole);
    const int32_t lt = local_target(split, t[r]);
    if (lt >= 0 && lt < V) s.logp[i] = z[static_cast<size_t>(lt)], s.match[i] = best == lt ? 1.0 : 0.0;
  }
  combine_vocab_rows(split, V, R, t, s.lse.data(), s.entropy.data(), s.logp.data(), mx.data(), s.match.data());
  return s;
}

void store_row(const std::vector<double>& v, Tensor& out) {
  for (size_t r = 0; r < v.size(); ++r) store_element(out.mutable_data(), out.dtype(), static_cast<int64_t>(r), v[r]);
}

// h:[R,C], w:[V,C], targets:[R] -> out:[R] f32.  log softmax(h·wᵀ)[target].
void token_logprobs(const Tensor& h, const Tensor& w, const Tensor& targets, const graph::VocabSplit& split, Tensor& out) {
  store_row(row_stats(h, w, &targets, split, "token_logprobs").logp, out);
}

// The backward pass of a loss on the logits z = h·wᵀ, given per row: dz_v = dz(r, g, z, stats, v), with g the
// incoming gradient of row r (rows with g = 0 are skipped) and the row's whole-vocabulary statistics. Writes packed
// [dh:[R,C] | dw:[V,C]]: dh = dz·w (this rank's part under a split), dw = dzᵀ·h.
template <class DzFn>
void logits_backward(const Tensor& h, const Tensor& w, const Tensor& grad, const graph::VocabSplit& split, Tensor& out, DzFn dz_of) {
  const int64_t C = h.size(-1), R = h.numel() / std::max<int64_t>(C, 1), V = w.size(0);
  const std::vector<double> hf = as_f64(h), wf = as_f64(w);
  const RowStats st = row_stats(h, w, nullptr, split, "logits_backward");  // every rank takes part (a collective)
  std::vector<double> z(static_cast<size_t>(V)), dz(static_cast<size_t>(V)), dh(static_cast<size_t>(R * C), 0.0), dw(static_cast<size_t>(V * C), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const double g = load_element(grad.data(), grad.dtype(), r);
    if (g == 0) continue;
    row_logits(hf, wf, r, C, V, h.dtype(), z);
    dz_of(r, g, z, st.lse[static_cast<size_t>(r)], st.entropy[static_cast<size_t>(r)], dz);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < C; ++c) {
        dh[static_cast<size_t>(r * C + c)] += dz[static_cast<size_t>(v)] * wf[static_cast<size_t>(v * C + c)];
        dw[static_cast<size_t>(v * C + c)] += dz[static_cast<size_t>(v)] * hf[static_cast<size_t>(r * C + c)];
      }
  }
  void* o = out.mutable_data();
  for (int64_t i = 0; i < R * C; ++i) store_element(o, out.dtype(), i, dh[static_cast<size_t>(i)]);
  if (out.numel() > R * C)  // without dw under attrs.dh_only (a frozen head)
    for (int64_t i = 0; i < V * C; ++i) store_element(o, out.dtype(), R * C + i, dw[static_cast<size_t>(i)]);
}

// dlogp:[R] -> packed [dh | dw].  dz = dlogp·(onehot(target) - softmax(z)).
void token_logprobs_backward(const Tensor& h, const Tensor& w, const Tensor& targets, const Tensor& dlogp, const graph::VocabSplit& split, Tensor& out) {
  logits_backward(h, w, dlogp, split, out, [&](int64_t r, double g, const std::vector<double>& z, double lse, double, std::vector<double>& dz) {
    const int32_t t = local_target(split, targets.data_as<int32_t>()[r]);
    for (size_t v = 0; v < z.size(); ++v) dz[v] = g * ((static_cast<int32_t>(v) == t ? 1.0 : 0.0) - std::exp(z[v] - lse));
  });
}

// out[r] = 1 where targets[r] is the first index of the largest logit of row r, else 0.
void token_argmax_match(const Tensor& h, const Tensor& w, const Tensor& targets, const graph::VocabSplit& split, Tensor& out) {
  store_row(row_stats(h, w, &targets, split, "token_argmax_match").match, out);
}

// h:[R,C], w:[V,C] -> out:[R].  H = -Σ p log p = lse - Σ p·z.
void entropy(const Tensor& h, const Tensor& w, const graph::VocabSplit& split, Tensor& out) {
  store_row(row_stats(h, w, nullptr, split, "entropy").entropy, out);
}

// h:[R,C], w:[V,C], targets:[R]|none -> packed f32 [logp | H | match | lse] (R each; see graph::Op::VocabStats),
// then with keep_logits the bf16 logits [R, V] in the bytes after them.
void vocab_stats(const Tensor& h, const Tensor& w, const Tensor* targets, const graph::Attrs& a, Tensor& out) {
  const int64_t C = h.size(-1), R = h.numel() / std::max<int64_t>(C, 1), V = w.size(0);
  const RowStats st = row_stats(h, w, targets, a.vocab, "vocab_stats");
  void* o = out.mutable_data();
  for (int64_t r = 0; r < R; ++r) {
    const size_t i = static_cast<size_t>(r);
    store_element(o, DType::F32, r, targets ? st.logp[i] : 0.0);
    store_element(o, DType::F32, R + r, a.entropy ? st.entropy[i] : 0.0);
    store_element(o, DType::F32, 2 * R + r, targets ? st.match[i] : 0.0);
    store_element(o, DType::F32, 3 * R + r, st.lse[i]);
  }
  if (!a.keep_logits) return;
  const std::vector<double> hf = as_f64(h), wf = as_f64(w);
  std::vector<double> z(static_cast<size_t>(V));
  auto* kept = reinterpret_cast<uint16_t*>(static_cast<float*>(o) + graph::kVocabStatRows * R);
  for (int64_t r = 0; r < R; ++r) {
    row_logits(hf, wf, r, C, V, h.dtype(), z);
    for (int64_t v = 0; v < V; ++v) kept[r * V + v] = f32_to_bf16(static_cast<float>(z[static_cast<size_t>(v)]));
  }
}

// dH:[R] -> packed [dh | dw].  dz_v = -dH·p_v·(log p_v + H).
void entropy_backward(const Tensor& h, const Tensor& w, const Tensor& dent, const graph::VocabSplit& split, Tensor& out) {
  logits_backward(h, w, dent, split, out, [](int64_t, double g, const std::vector<double>& z, double lse, double H, std::vector<double>& dz) {
    for (size_t v = 0; v < z.size(); ++v) dz[v] = -g * std::exp(z[v] - lse) * (z[v] - lse + H);
  });
}

// ---- distillation ----

// Row r's log-probabilities of the student (h·wᵀ) and the teacher (ht·wtᵀ), each side's logits rounded to its dtype.
struct JsdRows {
  int64_t R = 0, C = 0, Ct = 0, V = 0;
  std::vector<double> hf, wf, tf, vf;
  DType hd = DType::F32, td = DType::F32;
  JsdRows(const Tensor& h, const Tensor& w, const Tensor& ht, const Tensor& wt)
      : R(h.numel() / std::max<int64_t>(h.size(-1), 1)), C(h.size(-1)), Ct(ht.size(-1)), V(w.size(0)), hf(as_f64(h)), wf(as_f64(w)), tf(as_f64(ht)),
        vf(as_f64(wt)), hd(h.dtype()), td(ht.dtype()) {}
  void logprobs(int64_t r, std::vector<double>& ls, std::vector<double>& lt) const {
    const double a = row_logits(hf, wf, r, C, V, hd, ls), b = row_logits(tf, vf, r, Ct, V, td, lt);
    for (int64_t v = 0; v < V; ++v) ls[static_cast<size_t>(v)] -= a, lt[static_cast<size_t>(v)] -= b;
  }
};

// One row's generalized JSD (graph::Op::Jsd) from the two log-probability rows; *kl_sm receives KL(S‖M) (β = 1:
// KL(S‖T)), the constant of the row's gradient.
double jsd_row(const std::vector<double>& ls, const std::vector<double>& lt, double beta, double* kl_sm) {
  double kt = 0, ks = 0;
  for (size_t v = 0; v < ls.size(); ++v) {
    const double S = std::exp(ls[v]), T = std::exp(lt[v]);
    if (beta == 0) {
      kt += T * (lt[v] - ls[v]);
    } else if (beta == 1) {
      ks += S * (ls[v] - lt[v]);
    } else {
      const double lm = std::log((1 - beta) * S + beta * T);
      kt += T * (lt[v] - lm), ks += S * (ls[v] - lm);
    }
  }
  *kl_sm = beta == 0 ? 0.0 : ks;
  return beta == 0 ? kt : beta == 1 ? ks : beta * kt + (1 - beta) * ks;
}

// h, w, ht, wt -> packed [jsd | lse, lse_t, kl_sm as hi rows | their lo rows] (R each).
void jsd(const Tensor& h, const Tensor& w, const Tensor& ht, const Tensor& wt, double beta, Tensor& out) {
  const JsdRows j(h, w, ht, wt);
  std::vector<double> ls(static_cast<size_t>(j.V)), lt(static_cast<size_t>(j.V)), z(static_cast<size_t>(j.V));
  void* o = out.mutable_data();
  for (int64_t r = 0; r < j.R; ++r) {
    j.logprobs(r, ls, lt);
    double kl = 0;
    store_element(o, out.dtype(), r, jsd_row(ls, lt, beta, &kl));
    const double rows[3] = {row_logits(j.hf, j.wf, r, j.C, j.V, j.hd, z), row_logits(j.tf, j.vf, r, j.Ct, j.V, j.td, z), kl};
    for (int k = 0; k < 3; ++k) {  // hi + lo pairs (graph::JsdStat); f64 holds the whole value in hi
      const double hi = out.dtype() == DType::F64 ? rows[k] : static_cast<float>(rows[k]);
      store_element(o, out.dtype(), (k + 1) * j.R + r, hi);
      store_element(o, out.dtype(), (k + 4) * j.R + r, rows[k] - hi);
    }
  }
}

// djsd:[R] -> packed [dh | dw] of the student: dz_v = ∂J/∂zs_v (see graph::Op::Jsd), dh = dz·w, dw = dzᵀ·h.
void jsd_backward(const Tensor& h, const Tensor& w, const Tensor& ht, const Tensor& wt, const Tensor& djsd, double beta, Tensor& out) {
  const JsdRows j(h, w, ht, wt);
  const int64_t R = j.R, C = j.C, V = j.V;
  std::vector<double> ls(static_cast<size_t>(V)), lt(static_cast<size_t>(V)), dz(static_cast<size_t>(V)), dh(static_cast<size_t>(R * C), 0.0),
      dw(static_cast<size_t>(V * C), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const double g = load_element(djsd.data(), djsd.dtype(), r);
    if (g == 0) continue;
    j.logprobs(r, ls, lt);
    double kl = 0;
    jsd_row(ls, lt, beta, &kl);
    for (size_t v = 0; v < static_cast<size_t>(V); ++v) {
      const double S = std::exp(ls[v]), T = std::exp(lt[v]);
      if (beta == 0) dz[v] = g * (S - T);
      else if (beta == 1) dz[v] = g * S * (ls[v] - lt[v] - kl);
      else dz[v] = g * (1 - beta) * S * (ls[v] - std::log((1 - beta) * S + beta * T) - kl);
    }
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < C; ++c) {
        dh[static_cast<size_t>(r * C + c)] += dz[static_cast<size_t>(v)] * j.wf[static_cast<size_t>(v * C + c)];
        dw[static_cast<size_t>(v * C + c)] += dz[static_cast<size_t>(v)] * j.hf[static_cast<size_t>(r * C + c)];
      }
  }
  void* o = out.mutable_data();
  for (int64_t i = 0; i < R * C; ++i) store_element(o, out.dtype(), i, dh[static_cast<size_t>(i)]);
  if (out.numel() > R * C)  // without dw under attrs.dh_only (a frozen head)
    for (int64_t i = 0; i < V * C; ++i) store_element(o, out.dtype(), R * C + i, dw[static_cast<size_t>(i)]);
}

// out[r,k] = Σ_n dy[r,n]·w[n,k] (+ addend[r,k])
void matmul_nn(const Tensor& dy, const Tensor& w, const Tensor* addend, Tensor& out) {
  const int64_t N = w.size(0), K = w.size(1), R = dy.numel() / std::max<int64_t>(N, 1);
  const std::vector<double> a = as_f64(dy), b = as_f64(w);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t k = 0; k < K; ++k) {
      double acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += static_cast<double>(a[static_cast<size_t>(r * N + n)]) * b[static_cast<size_t>(n * K + k)];
      if (addend) acc += load_element(addend->data(), addend->dtype(), r * K + k);
      store_element(out.mutable_data(), out.dtype(), r * K + k, acc);
    }
  }
}

// out[n,k] = Σ_r a[r,n]·b[r,k]
void matmul_tn(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t N = a.size(-1), K = b.size(-1), R = a.numel() / std::max<int64_t>(N, 1);
  const std::vector<double> x = as_f64(a), y = as_f64(b);
  std::vector<double> acc(static_cast<size_t>(N * K), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t n = 0; n < N; ++n) {
      const double xv = x[static_cast<size_t>(r * N + n)];
      if (xv == 0) continue;
      for (int64_t k = 0; k < K; ++k) acc[static_cast<size_t>(n * K + k)] += xv * y[static_cast<size_t>(r * K + k)];
    }
  for (int64_t i = 0; i < N * K; ++i) store_element(out.mutable_data(), out.dtype(), i, acc[static_cast<size_t>(i)]);
}

void sum_rows(const Tensor& x, Tensor& out) {
  const int64_t N = x.size(-1), R = x.numel() / std::max<int64_t>(N, 1);
  for (int64_t n = 0; n < N; ++n) {
    double acc = 0;
    for (int64_t r = 0; r < R; ++r) acc += load_element(x.data(), x.dtype(), r * N + n);
    store_element(out.mutable_data(), out.dtype(), n, acc);
  }
}

// ids:[B,T], dy:[B,T,C] -> out:[V,C], scatter-add
void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor* base, const graph::VocabSplit& split, Tensor& out) {
  const int64_t C = dy.size(-1), V = out.size(0), whole = whole_vocab(split, V);
  std::vector<double> acc = base ? as_f64(*base) : std::vector<double>(static_cast<size_t>(V * C), 0.0);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (const int32_t t = ids.data_as<int32_t>()[i]; t < 0 || t >= whole) fail("embedding_backward: id {} out of range", t);
    const int32_t id = local_target(split, ids.data_as<int32_t>()[i]);
    if (id < 0 || id >= V) continue;  // another rank's row
    for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(id * C + c)] += load_element(dy.data(), dy.dtype(), i * C + c);
  }
  for (int64_t i = 0; i < V * C; ++i) store_element(out.mutable_data(), out.dtype(), i, acc[static_cast<size_t>(i)]);
}

// y = w·x·inv, inv = (mean(x²)+eps)^-1/2:  dx = inv·(w·dy) - inv³/C · x · Σ(w·dy·x)
void rms_norm_back_x(const Tensor& x, const Tensor& w, const Tensor& dy, double eps, Tensor& out) {
  const int64_t C = x.size(-1), R = x.numel() / std::max<int64_t>(C, 1);
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0, dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xv = load_element(x.data(), x.dtype(), r * C + c);
      ss += xv * xv;
      dot += load_element(w.data(), w.dtype(), c) * load_element(dy.data(), dy.dtype(), r * C + c) * xv;
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c) {
      const double xv = load_element(x.data(), x.dtype(), r * C + c);
      const double wdy = load_element(w.data(), w.dtype(), c) * load_element(dy.data(), dy.dtype(), r * C + c);
      store_element(out.mutable_data(), out.dtype(), r * C + c, inv * wdy - inv * inv * inv / static_cast<double>(C) * xv * dot);
    }
  }
}

void rms_norm_back_w(const Tensor& x, const Tensor& dy, double eps, Tensor& out) {
  const int64_t C = x.size(-1), R = x.numel() / std::max<int64_t>(C, 1);
  std::vector<double> acc(static_cast<size_t>(C), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xv = load_element(x.data(), x.dtype(), r * C + c);
      ss += xv * xv;
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c) {
      acc[static_cast<size_t>(c)] += load_element(dy.data(), dy.dtype(), r * C + c) * load_element(x.data(), x.dtype(), r * C + c) * inv;
    }
  }
  for (int64_t c = 0; c < C; ++c) store_element(out.mutable_data(), out.dtype(), c, acc[static_cast<size_t>(c)]);
}

// y = silu(g)·u:  dgate = dy·u·σ(g)(1 + g(1 - σ(g))),  dup = dy·silu(g)
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& out) {
  const int64_t n = gate.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double g = load_element(gate.data(), gate.dtype(), i), u = load_element(up.data(), up.dtype(), i);
    const double d = load_element(dy.data(), dy.dtype(), i);
    const double sig = 1.0 / (1.0 + std::exp(-g));
    store_element(out.mutable_data(), out.dtype(), i, d * u * sig * (1.0 + g * (1.0 - sig)));
    store_element(out.mutable_data(), out.dtype(), n + i, d * g * sig);
  }
}

// Backward of attention(): packed [dq | dk | dv], from P recomputed in f64.
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask, const Tensor& dy, const graph::Attrs& a,
                        Tensor& out) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1), Hkv = k.size(2);
  const int64_t rep = H / Hkv, offset = S - T;
  const std::vector<double> qf = as_f64(q), kf = as_f64(k), vf = as_f64(v), gf = as_f64(dy);
  std::vector<double> dq(qf.size(), 0.0), dk(kf.size(), 0.0), dv(vf.size(), 0.0), p(static_cast<size_t>(S)), dp(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / rep;
      for (int64_t t = 0; t < T; ++t) {
        const size_t qb = static_cast<size_t>(((b * T + t) * H + h) * D);
        double mx = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          const bool allowed = (!a.causal || s <= t + offset) && visible(mask, b, S, t + offset, s);
          if (!allowed) {
            p[static_cast<size_t>(s)] = -INFINITY;
            continue;
          }
          const size_t kb = static_cast<size_t>(((b * S + s) * Hkv + hk) * D);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qf[qb + static_cast<size_t>(d)]) * kf[kb + static_cast<size_t>(d)];
          p[static_cast<size_t>(s)] = dot * a.scale;
          mx = std::max(mx, p[static_cast<size_t>(s)]);
        }
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (int64_t s = 0; s < S; ++s) {
          p[static_cast<size_t>(s)] = p[static_cast<size_t>(s)] == -INFINITY ? 0.0 : std::exp(p[static_cast<size_t>(s)] - mx);
          sum += p[static_cast<size_t>(s)];
        }
        double pdp = 0;
        for (int64_t s = 0; s < S; ++s) {
          p[static_cast<size_t>(s)] /= sum;
          const size_t vb = static_cast<size_t>(((b * S + s) * Hkv + hk) * D);
          double x = 0;
          for (int64_t d = 0; d < D; ++d) x += gf[qb + static_cast<size_t>(d)] * static_cast<double>(vf[vb + static_cast<size_t>(d)]);
          dp[static_cast<size_t>(s)] = x;
          pdp += p[static_cast<size_t>(s)] * x;
        }
        for (int64_t s = 0; s < S; ++s) {
          const double ps = p[static_cast<size_t>(s)];
          if (ps == 0) continue;
          const double ds = ps * (dp[static_cast<size_t>(s)] - pdp) * a.scale;
          const size_t kb = static_cast<size_t>(((b * S + s) * Hkv + hk) * D);
          for (int64_t d = 0; d < D; ++d) {
            dq[qb + static_cast<size_t>(d)] += ds * kf[kb + static_cast<size_t>(d)];
            dk[kb + static_cast<size_t>(d)] += ds * qf[qb + static_cast<size_t>(d)];
            dv[kb + static_cast<size_t>(d)] += ps * gf[qb + static_cast<size_t>(d)];
          }
        }
      }
    }
  }
  int64_t i = 0;
  for (double x : dq) store_element(out.mutable_data(), out.dtype(), i++, x);
  for (double x : dk) store_element(out.mutable_data(), out.dtype(), i++, x);
  for (double x : dv) store_element(out.mutable_data(), out.dtype(), i++, x);
}

// The device mode's memory (backend "reference-device"): host bytes marked as device memory, so every host read of
// them fails as it would on a GPU. Only this file turns them back into host views, for the programs' kernels.
constexpr const char* kDeviceName = "reference-device";

// A device tensor that owns `bytes` (an owned host tensor no one else holds).
Tensor adopt(Tensor bytes, const std::string& name) {
  auto owned = std::make_shared<Tensor>(std::move(bytes));
  const std::string label = name.empty() ? fmt::format("a tensor in {} memory", kDeviceName) : fmt::format("'{}' in {} memory", name, kDeviceName);
  return Tensor::device(const_cast<void*>(owned->data()), owned->dtype(), owned->shape(), owned, label);
}
// A device tensor holding a copy of `host` (device-to-device copies are this too).
Tensor to_device(const Tensor& host, const std::string& name) { return adopt(host.clone(), name); }
// The host view of a device tensor's bytes; it keeps the device tensor alive (a two-stage program holds its stage-0
// inputs until stage 1, after the caller may have let go of them, as a device program holds its buffers).
Tensor host_view(const Tensor& device) {
  return Tensor::view(device.device_handle(), device.dtype(), device.shape(), std::make_shared<Tensor>(device));
}

class ReferenceProgram final : public Program {
 public:
  ReferenceProgram(Graph graph, bool device_memory) : graph_(std::move(graph)), device_(device_memory) {}

  std::vector<Tensor> run(const TensorMap& inputs) override {
    start(to_host(bind_inputs(graph_, inputs, memory())));
    execute(0, graph_.nodes.size());
    return finish();
  }

  std::vector<Tensor> run_stage(const TensorMap& inputs, int stage) override {
    const std::vector<Tensor> part = to_host(bind_stage_inputs(graph_, inputs, stage, memory()));
    const size_t boundary = graph::stage_boundary(graph_);
    if (stage == 0) {
      start(part);
      staged_ = true;
      execute(0, boundary);
      std::vector<Tensor> out;
      for (size_t i = 0; i < graph_.outputs.size(); ++i) {
        const auto v = static_cast<size_t>(graph_.outputs[i]);
        out.push_back(v < boundary ? to_memory(values_[v], i) : Tensor());
      }
      return out;
    }
    if (!staged_) fail("reference backend: stage 1 of a two-stage program needs its stage 0 first (Program::run_stage)");
    for (size_t i = 0; i < graph_.inputs.size(); ++i)
      if (part[i].data() != nullptr) values_[static_cast<size_t>(graph_.inputs[i])] = part[i];
    staged_ = false;
    execute(boundary, graph_.nodes.size());
    return finish();
  }

 private:
  void start(const std::vector<Tensor>& bound) {
    values_.assign(graph_.nodes.size(), Tensor());
    for (size_t i = 0; i < graph_.inputs.size(); ++i) values_[static_cast<size_t>(graph_.inputs[i])] = bound[i];
  }

  InputMemory memory() const { return device_ ? InputMemory::Device : InputMemory::Host; }
  // In the device mode: the bound device tensors as host views for the kernels (unbound ones stay empty).
  std::vector<Tensor> to_host(std::vector<Tensor> bound) const {
    if (device_)
      for (Tensor& t : bound)
        if (t.is_device()) t = host_view(t);
    return bound;
  }
  // An output as the caller gets it: in the device mode, a device tensor of its own (a copy: an output may be a
  // view of an input or of a value about to be freed).
  Tensor to_memory(const Tensor& value, size_t output) const {
    if (!device_ || value.numel() == 0) return value;
    const std::string& name = output < graph_.output_names.size() && !graph_.output_names[output].empty()
                                  ? graph_.output_names[output]
                                  : graph_.node(graph_.outputs[output]).name;
    return to_device(value, name);
  }

  // The outputs, then the values let go (the oracle holds nothing between runs).
  std::vector<Tensor> finish() {
    std::vector<Tensor> out;
    for (size_t i = 0; i < graph_.outputs.size(); ++i) out.push_back(to_memory(values_[static_cast<size_t>(graph_.outputs[i])], i));
    values_.clear();
    return out;
  }

  // Runs nodes [begin, end) on values_.
  void execute(size_t begin, size_t end) {
    std::vector<Tensor>& values = values_;
    auto in = [&](const Node& n, size_t i) -> const Tensor& { return values[static_cast<size_t>(n.inputs[i])]; };
    auto opt = [&](const Node& n, size_t i) -> const Tensor* {
      return n.inputs.size() > i && n.inputs[i] != kNone ? &values[static_cast<size_t>(n.inputs[i])] : nullptr;
    };
    for (size_t id = begin; id < end; ++id) {
      const Node& n = graph_.nodes[id];
      if (n.op == Op::Input) continue;
      if (n.op == Op::Reshape) {
        values[id] = in(n, 0).reshape(n.shape);
        continue;
      }
      if (n.op == Op::Cast) {
        values[id] = in(n, 0).to(n.dtype);
        continue;
      }
      if (n.op == Op::View) {
        values[id] = in(n, 0).slice_flat(n.attrs.offset, n.shape);
        continue;
      }
      Tensor out = Tensor::zeros(n.dtype, n.shape);
      try {
        switch (n.op) {
          case Op::Embedding: embedding(in(n, 0), in(n, 1), n.attrs.vocab, out); break;
          case Op::MatMul: matmul(in(n, 0), in(n, 1), opt(n, 2), opt(n, 3), out); break;
          case Op::RmsNorm: rms_norm(in(n, 0), in(n, 1), n.attrs.eps, out); break;
          case Op::Rope: rope(in(n, 0), in(n, 1), n.attrs, out); break;
          case Op::Attention: attention(in(n, 0), in(n, 1), in(n, 2), opt(n, 3), opt(n, 4), opt(n, 5), n.attrs, out); break;
          case Op::Slice: {
            const Tensor& x = in(n, 0);
            const int64_t T = x.size(1), inner = x.numel() / (x.size(0) * T), es = static_cast<int64_t>(dtype_size(x.dtype()));
            for (int64_t b = 0; b < x.size(0); ++b)
              std::memcpy(static_cast<char*>(out.mutable_data()) + b * n.attrs.rows * inner * es,
                          static_cast<const char*>(x.data()) + (b * T + n.attrs.offset) * inner * es, static_cast<size_t>(n.attrs.rows * inner * es));
            break;
          }
          case Op::KvCacheWrite: {  // functional here: a new cache value (hosts copy it back when it is not the same memory)
            // pos [1] (every row) or [B] (row b's first slot); rows [B]: x's row b goes to cache row rows[b].
            const Tensor& cache = in(n, 0);
            const Tensor& x = in(n, 1);
            const Tensor& pt = in(n, 2);
            const Tensor* rows = opt(n, 3);
            const int64_t S = cache.size(1), T = x.size(1), row = cache.size(2) * cache.size(3);
            out.copy_from(cache);
            for (int64_t b = 0; b < x.size(0); ++b) {
              const int64_t pos = pt.data_as<int32_t>()[pt.numel() == 1 ? 0 : b], cb = rows ? rows->data_as<int32_t>()[b] : b;
              if (pos < 0 || pos + T > S) fail("kv_cache_write {}: rows [{}, {}) do not fit a cache of {}", n.name, pos, pos + T, S);
              if (cb < 0 || cb >= cache.size(0)) fail("kv_cache_write {}: cache row {} is outside the cache's {} rows", n.name, cb, cache.size(0));
              for (int64_t t = 0; t < T; ++t)
                for (int64_t i = 0; i < row; ++i)
                  store_element(out.mutable_data(), out.dtype(), ((cb * S + pos + t) * row) + i, load_element(x.data(), x.dtype(), (b * T + t) * row + i));
            }
            break;
          }
          case Op::SwiGLU: swiglu(in(n, 0), in(n, 1), out); break;
          case Op::Add: add(in(n, 0), in(n, 1), out); break;
          case Op::TokenLogprobs: token_logprobs(in(n, 0), in(n, 1), in(n, 2), n.attrs.vocab, out); break;
          case Op::Entropy: entropy(in(n, 0), in(n, 1), n.attrs.vocab, out); break;
          case Op::TokenArgmaxMatch: token_argmax_match(in(n, 0), in(n, 1), in(n, 2), n.attrs.vocab, out); break;
          case Op::VocabStats: vocab_stats(in(n, 0), in(n, 1), opt(n, 2), n.attrs, out); break;
          case Op::WeightedSum: {
            double acc = 0;
            for (int64_t i = 0; i < in(n, 0).numel(); ++i) {
              acc += load_element(in(n, 0).data(), in(n, 0).dtype(), i) * load_element(in(n, 1).data(), in(n, 1).dtype(), i);
            }
            store_element(out.mutable_data(), out.dtype(), 0, acc);
            break;
          }
          case Op::Fill:
            for (int64_t i = 0; i < out.numel(); ++i) store_element(out.mutable_data(), out.dtype(), i, n.attrs.value);
            break;
          case Op::MatMulNN: matmul_nn(in(n, 0), in(n, 1), opt(n, 2), out); break;
          case Op::MatMulTN: matmul_tn(in(n, 0), in(n, 1), out); break;
          case Op::SumRows: sum_rows(in(n, 0), out); break;
          case Op::ScaleBy: {
            const double sc = load_element(in(n, 1).data(), in(n, 1).dtype(), 0);
            for (int64_t i = 0; i < out.numel(); ++i) store_element(out.mutable_data(), out.dtype(), i, sc * load_element(in(n, 0).data(), in(n, 0).dtype(), i));
            break;
          }
          case Op::EmbeddingBackward: embedding_backward(in(n, 0), in(n, 1), opt(n, 2), n.attrs.vocab, out); break;
          case Op::RmsNormBackX: rms_norm_back_x(in(n, 0), in(n, 1), in(n, 2), n.attrs.eps, out); break;
          case Op::RmsNormBackW: rms_norm_back_w(in(n, 0), in(n, 1), n.attrs.eps, out); break;
          case Op::SwiGLUBackward: swiglu_backward(in(n, 0), in(n, 1), in(n, 2), out); break;
          case Op::AttentionBackward: attention_backward(in(n, 0), in(n, 1), in(n, 2), opt(n, 3), in(n, 4), n.attrs, out); break;
          case Op::TokenLogprobsBackward: token_logprobs_backward(in(n, 0), in(n, 1), in(n, 2), in(n, 3), n.attrs.vocab, out); break;
          case Op::EntropyBackward: entropy_backward(in(n, 0), in(n, 1), in(n, 2), n.attrs.vocab, out); break;
          case Op::AllReduce:
            out.copy_from(in(n, 0));
            all_reduce_in_group(n.attrs.group, out.mutable_data(), out.numel(), out.dtype());
            break;
          case Op::AllReduceGrad: out.copy_from(in(n, 0)); break;
          case Op::MoeTopK: reference::moe_topk(in(n, 0), out); break;
          case Op::MoeRouteWeights: reference::moe_route_weights(in(n, 0), in(n, 1), n.attrs.normalize, out); break;
          case Op::MoeExperts: reference::moe_experts(in(n, 0), in(n, 1), in(n, 2), in(n, 3), in(n, 4), n.attrs.offset, n.attrs.rows, out); break;
          case Op::MoeRouterStats: reference::moe_router_stats(in(n, 0), in(n, 1), opt(n, 2), out); break;
          case Op::MoeAuxLoss: reference::moe_aux_loss(in(n, 0), out); break;
          case Op::MoeRouteWeightsBackward: reference::moe_route_weights_backward(in(n, 0), in(n, 1), in(n, 2), n.attrs.normalize, out); break;
          case Op::MoeExpertsBackward:
            reference::moe_experts_backward(in(n, 0), in(n, 1), in(n, 2), in(n, 3), in(n, 4), in(n, 5), n.attrs.dh_only, n.attrs.offset, n.attrs.rows,
                                            out);
            break;
          case Op::MoeRouterStatsBackward: reference::moe_router_stats_backward(in(n, 0), opt(n, 1), in(n, 2), out); break;
          case Op::MoeAuxLossBackward: reference::moe_aux_loss_backward(in(n, 0), in(n, 1), out); break;
          case Op::BatchedMatMul: reference::batched_matmul(in(n, 0), in(n, 1), n.attrs.trans_a, n.attrs.trans_b, out); break;
          case Op::Jsd: jsd(in(n, 0), in(n, 1), in(n, 2), in(n, 3), n.attrs.value, out); break;
          case Op::JsdBackward: jsd_backward(in(n, 0), in(n, 1), in(n, 2), in(n, 3), in(n, 4), n.attrs.value, out); break;
          case Op::Dropout: {
            const uint64_t seed = dropout_seed(in(n, 1).data_as<int32_t>());
            const uint32_t threshold = dropout_threshold(n.attrs.value);
            const double keep_scale = 1.0 / (1.0 - n.attrs.value);
            for (int64_t i = 0; i < out.numel(); ++i) {
              const bool keep = dropout_keep(seed, n.attrs.offset, i, threshold);
              store_element(out.mutable_data(), out.dtype(), i, keep ? keep_scale * load_element(in(n, 0).data(), in(n, 0).dtype(), i) : 0.0);
            }
            break;
          }
          default: fail("reference backend: op {} is not implemented", graph::op_name(n.op));
        }
      } catch (const Error& e) {
        fail("{} ({}): {}", n.name.empty() ? graph::op_name(n.op) : n.name, graph::op_name(n.op), e.what());
      }
      values[id] = std::move(out);
      // Free values no later node reads (keeps the oracle's memory at the working set, not the whole graph).
      release_dead(values, id);
    }
  }

  void release_dead(std::vector<Tensor>& values, size_t current) {
    if (last_use_.empty()) {
      last_use_.assign(graph_.nodes.size(), 0);
      for (size_t i = 0; i < graph_.nodes.size(); ++i) {
        for (graph::ValueId in : graph_.nodes[i].inputs) {
          if (in != kNone) last_use_[static_cast<size_t>(in)] = i;
        }
      }
      for (graph::ValueId v : graph_.outputs) last_use_[static_cast<size_t>(v)] = graph_.nodes.size();
    }
    for (graph::ValueId in : graph_.nodes[current].inputs) {
      if (in != kNone && last_use_[static_cast<size_t>(in)] == current && graph_.node(in).op != Op::Input) {
        values[static_cast<size_t>(in)] = Tensor();
      }
    }
  }

  Graph graph_;
  std::vector<size_t> last_use_;
  std::vector<Tensor> values_;  // during a run, and from a stage 0 to its stage 1
  bool staged_ = false;
  bool device_ = false;
};

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(bool device_memory) : device_(device_memory) {}
  std::string name() const override { return device_ ? kDeviceName : "reference"; }
  bool host_memory() const override { return !device_; }
  Tensor upload(const Tensor& host, const std::string& name) override {
    if (!device_) return host;
    if (host.is_device()) fail("upload of '{}': it is already {}", name, host.device_label());
    ++transfers_.uploads;
    transfers_.upload_bytes += static_cast<int64_t>(host.nbytes());
    transfers_.largest_upload = std::max(transfers_.largest_upload, static_cast<int64_t>(host.nbytes()));
    return to_device(host, name);
  }
  void upload_into(Tensor& dst, const Tensor& host) override {
    if (!device_) return Backend::upload_into(dst, host);
    if (host.is_device()) fail("upload_into {}: the source is {}, not host memory", dst.device_label(), host.device_label());
    Tensor view = on_host(dst, "upload_into");
    view.copy_from(host);
    ++transfers_.uploads;
    transfers_.upload_bytes += static_cast<int64_t>(host.nbytes());
    transfers_.largest_upload = std::max(transfers_.largest_upload, static_cast<int64_t>(host.nbytes()));
  }
  Tensor download(const Tensor& tensor) override {
    if (!device_ || !tensor.is_device()) return tensor;
    count_download(static_cast<int64_t>(tensor.nbytes()));
    return host_view(tensor).clone();
  }
  Transfers transfers() const override { return transfers_; }
  // The between-program work on device tensors: on their host views here, as a device runs it in its memory.
  void accumulate(Tensor& acc, const Tensor& x, bool first) override {
    Tensor a = on_host(acc, "accumulate");
    Backend::accumulate(a, on_host(x, "accumulate"), first);
  }
  // The sums come down (one download of their doubles).
  std::vector<double> sum_of_squares(const std::vector<Tensor>& xs, const std::vector<int>& group_of) override {
    std::vector<Tensor> h;
    for (const Tensor& t : xs) h.push_back(on_host(t, "sum_of_squares"));
    std::vector<double> sums = Backend::sum_of_squares(h, group_of);
    if (device_ && !sums.empty()) count_download(static_cast<int64_t>(sums.size() * sizeof(double)));
    return sums;
  }
  // The sums run on the device's bytes (a device's collectives read its memory): nothing is counted as crossing.
  void all_reduce(std::vector<Tensor>& xs, dist::Communicator& comm) override {
    std::vector<Tensor> h;
    for (const Tensor& t : xs) h.push_back(on_host(t, "all_reduce"));
    Backend::all_reduce(h, comm);
  }
  void scale(std::vector<Tensor>& xs, float factor) override {
    std::vector<Tensor> h;
    for (const Tensor& t : xs) h.push_back(on_host(t, "scale"));
    Backend::scale(h, factor);
  }
  Tensor allocate(DType dtype, const Shape& shape, const std::string& name) override {
    if (!device_) return Backend::allocate(dtype, shape, name);
    return adopt(Tensor::uninitialized(dtype, shape), name);
  }
  void adamw_step(const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& weight, Tensor* compute, const AdamWStep& step) override {
    Tensor m = on_host(exp_avg, "adamw_step"), v = on_host(exp_avg_sq, "adamw_step"), w = on_host(weight, "adamw_step");
    Tensor c = compute != nullptr ? on_host(*compute, "adamw_step") : Tensor();
    Backend::adamw_step(on_host(grad, "adamw_step"), m, v, w, compute != nullptr ? &c : nullptr, step);
  }
  void zero(Tensor& t) override {
    Tensor h = on_host(t, "zero");
    Backend::zero(h);
  }
  Tensor copy(const Tensor& t, const std::string& name) override {
    if (!device_) return t.clone();
    return to_device(on_host(t, "copy"), name);
  }
  Tensor mix(const Tensor& target, const Tensor& source, float alpha, const std::string& name) override {
    if (!device_) return Backend::mix(target, source, alpha, name);
    ReferenceBackend host(/*device_memory=*/false);
    return adopt(host.mix(on_host(target, "mix"), on_host(source, "mix"), alpha, name), name);
  }
  std::vector<double> span_sums(const Tensor& values, const Tensor* weights, const Tensor* factors, const std::vector<Span>& spans) override {
    if (!device_) return Backend::span_sums(values, weights, factors, spans);
    const Tensor w = weights != nullptr ? on_host(*weights, "span_sums") : Tensor(), f = factors != nullptr ? on_host(*factors, "span_sums") : Tensor();
    std::vector<double> sums =
        Backend::span_sums(on_host(values, "span_sums"), weights != nullptr ? &w : nullptr, factors != nullptr ? &f : nullptr, spans);
    count_download(static_cast<int64_t>(sums.size() * sizeof(double)));
    return sums;
  }
  // The loss runs where the log-probs are; its metrics come down (one download of the metrics' doubles).
  PolicyLossMetrics policy_loss(const PolicyLossRequest& request, Tensor& seed) override {
    if (!device_) return Backend::policy_loss(request, seed);
    PolicyLossRequest r = request;
    Tensor views[5];
    const Tensor** inputs[5] = {&r.logp, &r.mask, &r.entropy, &r.old_logp, &r.ref_logp};
    const char* names[5] = {"policy_loss's log-probs", "policy_loss's loss mask", "policy_loss's entropy", "policy_loss's old log-probs",
                            "policy_loss's reference log-probs"};
    for (int k = 0; k < 5; ++k)
      if (*inputs[k] != nullptr) views[k] = on_host(**inputs[k], names[k]), *inputs[k] = &views[k];
    Tensor s = on_host(seed, "policy_loss's seed");
    const PolicyLossMetrics m = Backend::policy_loss(r, s);
    count_download(static_cast<int64_t>(sizeof(PolicyLossMetrics)));
    return m;
  }
  void copy_rows(const Tensor& src, const std::vector<int64_t>& src_rows, Tensor& dst, const std::vector<int64_t>& dst_rows) override {
    Tensor d = on_host(dst, "copy_rows");
    Backend::copy_rows(on_host(src, "copy_rows"), src_rows, d, dst_rows);
  }
  // The choice runs where the logits are; the ids come down (counted as one download of rows x 4 bytes).
  std::vector<int32_t> sample(const Tensor& logits, const SampleRequest& request) override {
    if (!device_) return Backend::sample(logits, request);
    SampleRequest r = request;
    Tensor context;
    if (request.context != nullptr) context = on_host(*request.context, "sample"), r.context = &context;
    std::vector<int32_t> ids = Backend::sample(on_host(logits, "sample"), r);
    count_download(static_cast<int64_t>(ids.size() * sizeof(int32_t)));
    return ids;
  }
  std::unique_ptr<Program> compile(const Graph& graph) override {
    return std::make_unique<ReferenceProgram>(graph::eliminate_dead_code(graph), device_);
  }

 private:
  // A tensor of this backend's memory as the host loops see it: the host view of a device tensor; on the host
  // oracle the tensor itself. The wrong memory is an error naming the call.
  Tensor on_host(const Tensor& t, const char* what) const {
    if (device_ != t.is_device())
      fail("{} on the {} backend: {}", what, name(), device_ ? "a tensor in host memory (upload it first)" : t.device_label() + " (download it first)");
    return device_ ? host_view(t) : t;
  }

  // What a call brings down to the host (a download, the sums or ids a call returns).
  void count_download(int64_t bytes) {
    ++transfers_.downloads;
    transfers_.download_bytes += bytes;
    transfers_.largest_download = std::max(transfers_.largest_download, bytes);
  }

  bool device_;
  Transfers transfers_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(/*device_memory=*/false); }
std::unique_ptr<Backend> make_reference_device_backend() {
  return std::make_unique<ReferenceBackend>(/*device_memory=*/true);
}

}  // namespace trl

// The vocabulary ops on the CPU: vocab_stats (the fused forward pass that graph::fuse_vocabulary_ops makes of
// token_logprobs, entropy and token_argmax_match on one (h, w)), those three on their own, and the backward nodes
// token_logprobs_backward and entropy_backward. Shapes: h:[R,C] (leading dims flattened), w:[V,C], targets:[R].
//
// Logits are formed [R, 4096] at a time through oneDNN, never [R, V].
// - The forward pass keeps per row a running max m (and where it first occurs), s = Σ e^(z-m) and (entropy)
//   t = Σ e^(z-m)·z, rescaled when m grows: lse = m + log s, H = lse - t/s, logp = z[target] - lse.
// - A backward node reads lse and H from its `stats` input (the vocab_stats node of the same (h, w)), and with
//   keep_logits the bf16 logits too (a bf16 model rounds its logits to bf16 before the loss, so keeping them is
//   exact: R·V·2 bytes, 311 MB for 1024 rows of Qwen3, in place of a third lm_head GEMM per chunk). Without
//   `stats` it runs the forward pass itself. Then per chunk
//     token_logprobs: dz = dlogp·(onehot(target) - p);   entropy: dz = -dH·p·(log p + H),
//   in the GEMM type (bf16 for a bf16 model, as autocast rounds the logits' gradient), and two GEMMs accumulate
//   dh += dz·w_chunk and write dw_chunk = dzᵀ·h, in f32.
// - Vocabulary parallel (attrs.vocab split): w is this rank's rows of the lm_head; targets are of the whole
//   vocabulary. The forward pass runs over the rank's rows, then combine_vocab_rows makes lse, H, logp and the
//   argmax match the whole vocabulary's; the backward nodes then give dw of the rank's rows and its part of dh.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/logits_head.h"
#include "backend/cpu/lower.h"
#include "backend/cpu/vec.h"
#include "backend/vocab_parallel.h"
#include "trl/core/error.h"

namespace trl::cpu {

namespace {

using graph::ValueId;
using graph::VocabStat;

constexpr int64_t kRows = graph::kVocabStatRows;
using Head = LogitsHead;

// The forward pass over V. stats: [logp | H | match | lse] (R each; logp and match 0 without targets, H 0 without
// want_entropy); keep (or null): the bf16 logits [R, V]; acc: scratch for 4R floats (running max, Σe, Σe·z, argmax).
void forward_pass(const ProgramContext* cx, const Head& hd, const char* hp, ValueId w, const int32_t* whole_t, bool want_entropy,
                  float* stats, uint16_t* keep, float* acc) {
  const int64_t R = hd.R, V = hd.V;
  hd.check_targets(whole_t);
  std::vector<int32_t> local;
  const int32_t* t = hd.local_targets(whole_t, local);
  float* lg = reinterpret_cast<float*>(cx->scratch(hd.logits_at));
  float *logp = stats, *ent = stats + R, *match = stats + 2 * R, *lse = stats + 3 * R;
  float *mx = acc, *sum = acc + R, *tz = acc + 2 * R;
  int32_t* arg = reinterpret_cast<int32_t*>(acc + 3 * R);  // the first index of the running max
  std::fill(mx, mx + R, -INFINITY);
  std::fill(sum, sum + 2 * R, 0.0f);  // sum and tz
  std::fill(stats, stats + kRows * R, 0.0f);
  for (int64_t j0 = 0; j0 < V; j0 += hd.chunk) {
    const int64_t c = std::min(hd.chunk, V - j0);
    hd.logits(cx, hp, w, j0, c, lg);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      float* z = lg + r * c;
      hd.round_row(z, c);
      if (keep) vec::bf16_bits(z, c, keep + r * V + j0);  // exact: z is already bf16
      if (t && t[r] >= j0 && t[r] < j0 + c) logp[r] = z[t[r] - j0];
      float cm = -INFINITY;
      for (int64_t j = 0; j < c; ++j) cm = std::max(cm, z[j]);
      const float old = mx[r], m = std::max(old, cm);
      if (t && (cm > old || j0 == 0)) arg[r] = static_cast<int32_t>(j0 + (std::find(z, z + c, cm) - z));
      const float rescale = old == -INFINITY ? 0.0f : std::exp(old - m);
      // z ← e^(z-m) in place (the chunk is recomputed when needed again); Σ e^(z-m)·z = ey + m·Σ e^(z-m).
      float ey = 0;
      const float se = want_entropy ? vec::exp_shift_sum_ey(z, c, m, &ey) : vec::exp_shift_sum(z, c, m);
      if (want_entropy) tz[r] = tz[r] * rescale + ey + m * se;
      mx[r] = m;
      sum[r] = sum[r] * rescale + se;
    }
  }
  if (hd.split.split()) {  // this rank's statistics, then the whole vocabulary's (in f64)
    std::vector<double> l(static_cast<size_t>(R)), e(static_cast<size_t>(R)), z(static_cast<size_t>(R)), m(static_cast<size_t>(R)),
        f(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      const size_t i = static_cast<size_t>(r);
      l[i] = mx[r] + std::log(static_cast<double>(sum[r]));
      e[i] = want_entropy ? static_cast<double>(tz[r]) / sum[r] : 0.0;
      z[i] = logp[r], m[i] = mx[r];
      f[i] = t && arg[r] == t[r] ? 1.0 : 0.0;
    }
    combine_vocab_rows(hd.split, V, R, whole_t, l.data(), want_entropy ? e.data() : nullptr, z.data(), m.data(), f.data());
    for (int64_t r = 0; r < R; ++r) {
      const size_t i = static_cast<size_t>(r);
      lse[r] = static_cast<float>(l[i]);
      if (want_entropy) ent[r] = static_cast<float>(e[i]);
      if (t) logp[r] = static_cast<float>(z[i]), match[r] = static_cast<float>(f[i]);
    }
    return;
  }
  for (int64_t r = 0; r < R; ++r) {
    lse[r] = mx[r] + std::log(sum[r]);
    if (want_entropy) ent[r] = lse[r] - tz[r] / sum[r];
    if (t) {
      logp[r] -= lse[r];
      match[r] = arg[r] == t[r] ? 1.0f : 0.0f;
    }
  }
}

const int32_t* targets_of(const ProgramContext* cx, ValueId tg) {
  return tg != kNone ? static_cast<const int32_t*>(cx->p(tg)) : nullptr;
}

}  // namespace

// vocab_stats: h, w, targets|none -> packed [logp | H | match | lse] (+ kept bf16 logits [R, V]).
Kernel lower_vocab_stats(ProgramContext* cx, ValueId id) {
  const Node& n = cx->nd(id);
  const ValueId h = n.inputs[0], w = n.inputs[1], tg = n.inputs[2];
  const Head hd = make_head(cx, n, h, w);
  const bool want_entropy = n.attrs.entropy, keep = n.attrs.keep_logits;
  if (keep && hd.hw != DType::BF16) fail("cpu backend: vocab_stats keeps bf16 logits, but h and w are not both bf16");
  const size_t acc_at = cx->reserve_scratch(static_cast<size_t>(4 * hd.R) * sizeof(float));
  return [=] {
    float* out = static_cast<float*>(cx->p(id));
    uint16_t* kept = keep ? reinterpret_cast<uint16_t*>(out + kRows * hd.R) : nullptr;
    forward_pass(cx, hd, hd.h_input(cx, h), w, targets_of(cx, tg), want_entropy, out, kept, reinterpret_cast<float*>(cx->scratch(acc_at)));
  };
}

// token_logprobs, entropy, token_argmax_match on their own (a graph compiled without fuse_vocabulary_ops): the
// same pass into scratch, then the one row.
Kernel lower_vocab_forward(ProgramContext* cx, ValueId id) {
  const Node& n = cx->nd(id);
  const ValueId h = n.inputs[0], w = n.inputs[1], tg = n.op == Op::Entropy ? kNone : n.inputs[2];
  const Head hd = make_head(cx, n, h, w);
  const VocabStat row = n.op == Op::TokenLogprobs ? VocabStat::Logprob : n.op == Op::Entropy ? VocabStat::Entropy : VocabStat::Match;
  const DType od = n.dtype;
  const size_t stats_at = cx->reserve_scratch(static_cast<size_t>((kRows + 4) * hd.R) * sizeof(float));
  return [=] {
    float* stats = reinterpret_cast<float*>(cx->scratch(stats_at));
    forward_pass(cx, hd, hd.h_input(cx, h), w, targets_of(cx, tg), row == VocabStat::Entropy, stats, nullptr, stats + kRows * hd.R);
    const float* v = stats + static_cast<int64_t>(row) * hd.R;
    for (int64_t r = 0; r < hd.R; ++r) st(cx->p(id), od, r, v[r]);
  };
}

// token_logprobs_backward: h, w, targets, dlogp, stats|none; entropy_backward: h, w, dH, stats|none
//   -> packed f32 [dh:[R,C] | dw:[V,C]].
Kernel lower_vocab_backward(ProgramContext* cx, ValueId id) {
  const Node& n = cx->nd(id);
  const bool entropy = n.op == Op::EntropyBackward;
  const ValueId h = n.inputs[0], w = n.inputs[1], tg = entropy ? kNone : n.inputs[2], dl = n.inputs[entropy ? 2 : 3];
  const size_t stats_slot = entropy ? 3 : 4;
  const ValueId stats_in = n.inputs.size() > stats_slot ? n.inputs[stats_slot] : kNone;
  if (n.dtype != DType::F32) fail("cpu backend: {} produces f32 gradients, not {}", graph::op_name(n.op), dtype_name(n.dtype));
  const Head hd = make_head(cx, n, h, w);
  const int64_t R = hd.R, C = hd.C, V = hd.V, chunk = hd.chunk;
  const DType dd = cx->nd(dl).dtype;
  const bool kept = stats_in != kNone && cx->nd(stats_in).attrs.keep_logits;
  if (stats_in != kNone && entropy && !cx->nd(stats_in).attrs.entropy) fail("cpu backend: entropy_backward's stats have no entropy row");
  // Without a stats input: the forward pass's stats and accumulators in scratch.
  const size_t own_at = stats_in == kNone ? cx->reserve_scratch(static_cast<size_t>((kRows + 4) * R) * sizeof(float)) : 0;
  const bool dh_only = n.attrs.dh_only;  // a frozen head (LoRA): no dw GEMMs
  const HeadGradGemms gg = make_grad_gemms(cx, hd);
  const bool to16 = gg.to16;  // dz in bf16 for a bf16 GEMM
  return [=] {
    const char* hp = hd.h_input(cx, h);
    hd.check_targets(targets_of(cx, tg));
    std::vector<int32_t> local;
    const int32_t* t = hd.local_targets(targets_of(cx, tg), local);
    // Phase 1: the row statistics, from the vocab_stats node or computed here.
    const float* stats = nullptr;
    const uint16_t* kept16 = nullptr;
    if (stats_in != kNone) {
      stats = static_cast<const float*>(cx->p(stats_in));
      if (kept) kept16 = reinterpret_cast<const uint16_t*>(stats + kRows * R);
    } else {
      float* own = reinterpret_cast<float*>(cx->scratch(own_at));
      forward_pass(cx, hd, hp, w, nullptr, entropy, own, nullptr, own + kRows * R);
      stats = own;
    }
    const float* ent = stats + static_cast<int64_t>(VocabStat::Entropy) * R;
    const float* lse = stats + static_cast<int64_t>(VocabStat::Lse) * R;
    // Phase 2: dz per chunk, then dh += dz·w_chunk and dw_chunk = dzᵀ·h.
    float* lg = reinterpret_cast<float*>(cx->scratch(hd.logits_at));
    uint16_t* dz16 = to16 ? reinterpret_cast<uint16_t*>(cx->scratch(gg.dz16_at)) : nullptr;
    float* out = static_cast<float*>(cx->p(id));
    std::fill(out, out + R * C, 0.0f);
    for (int64_t j0 = 0; j0 < V; j0 += chunk) {
      const int64_t c = std::min(chunk, V - j0);
      const char* wp = kept16 ? hd.w_chunk(cx, w, j0, c) : hd.logits(cx, hp, w, j0, c, lg);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        const float g = ld(cx->p(dl), dd, r);
        float* z = lg + r * c;
        uint16_t* z16 = to16 ? dz16 + r * c : nullptr;
        if (kept16) {
          const uint16_t* k = kept16 + r * V + j0;
          for (int64_t j = 0; j < c; ++j) z[j] = bf16_to_f32(k[j]);
        } else {
          hd.round_row(z, c);
        }
        if (entropy) {
          // dz = -g·p·(z - lse + H)
          const float shift = ent[r] - lse[r];
          for (int64_t j = 0; j < c; ++j) {
            const float pj = std::exp(z[j] - lse[r]);
            z[j] = -g * pj * (z[j] + shift);
          }
          if (to16)
            for (int64_t j = 0; j < c; ++j) z16[j] = f32_to_bf16(z[j]);
          continue;
        }
        vec::exp_shift(z, c, lse[r]);  // softmax of the chunk
        const bool hit = t[r] >= j0 && t[r] < j0 + c;
        if (to16) {
          vec::scale_to_bf16(z, c, -g, z16);
          if (hit) z16[t[r] - j0] = f32_to_bf16(g * (1.0f - z[t[r] - j0]));
        } else {
          for (int64_t j = 0; j < c; ++j) z[j] = -g * z[j];
          if (hit) z[t[r] - j0] += g;
        }
      }
      const void* dz = to16 ? static_cast<const void*>(dz16) : static_cast<const void*>(lg);
      gg.run(dz, wp, hp, out, j0, c, dh_only);
    }
  };
}

}  // namespace trl::cpu

// The vocabulary ops on the CPU: token_logprobs, entropy, token_argmax_match and their backward, chunked over V.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>
#include <array>
#include <map>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/lower.h"
#include "backend/cpu/vec.h"
#include "core/cpu_features.h"
#include "trl/core/error.h"

namespace trl::cpu {

// token_logprobs, entropy and token_argmax_match over vocabulary chunks: logits [R, 4096] at a time through
// oneDNN, never [R, V]. Pass 1 keeps per row a running max m (and where it first occurs), s = Σ e^(z-m) and
// (entropy) t = Σ e^(z-m)·z, rescaled when m grows: lse = m + log s, H = lse - t/s. The forward nodes on the same
// (h, w) (and targets) share that one pass: the first of them in program order computes what all of them need,
// the others copy their values out (a trainer's entropy and accuracy metrics cost no second lm_head GEMM).
// The backward node of the same (h, w[, targets]) reuses these statistics instead of recomputing the logits
// once more, then forms dz per chunk:
//   token_logprobs: dz = dlogp·(onehot(target) - p);   entropy: dz = -dH·p·(log p + H),
// in the GEMM type (bf16 for a bf16 model, as autocast rounds the logits' gradient), and accumulates
// dh += dz·w_chunk and dw_chunk = dzᵀ·h in f32.
namespace {

constexpr int64_t kVocabChunk = 4096;  // logits are formed [rows, 4096] at a time

struct RowStats {
  std::vector<float> lse, ent, target;
  std::vector<int32_t> arg;
  int64_t saved = -1;  // scratch offset of the bf16 logits [chunks][R][c] kept for the backward node, or -1
};
struct PassGroup {
  graph::ValueId targets;
  std::shared_ptr<RowStats> stats;
};
// The passes of one program: forward nodes sharing a pass by (h, w), and the statistics a backward node reuses,
// by (h, w, targets | -2 for entropy).
struct VocabPasses {
  std::map<std::pair<graph::ValueId, graph::ValueId>, PassGroup> groups;
  std::map<std::array<graph::ValueId, 3>, std::shared_ptr<RowStats>> saved;
};

}  // namespace

Kernel lower_vocab(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  VocabPasses& passes = cx->family_state<VocabPasses>("vocab");
  const bool entropy = n.op == Op::Entropy || n.op == Op::EntropyBackward;
  const bool backward = n.op == Op::TokenLogprobsBackward || n.op == Op::EntropyBackward;
  const graph::ValueId h = n.inputs[0], w = n.inputs[1], tg = entropy ? kNone : n.inputs[2];
  const graph::ValueId dl = backward ? n.inputs[entropy ? 2 : 3] : kNone;
  const int64_t C = cx->nd(h).shape.back(), R = shape_numel(cx->nd(h).shape) / C, V = cx->nd(w).shape[0];
  const DType dh = cx->nd(h).dtype, dw = cx->nd(w).dtype, od = n.dtype, dd = backward ? cx->nd(dl).dtype : DType::F32;
  const int64_t chunk = std::min(kVocabChunk, V);
  if (backward && od != DType::F32) fail("cpu backend: {} produces f32 gradients, not {}", graph::op_name(n.op), dtype_name(od));
  const char* what = graph::op_name(n.op);
  const Op op = n.op;
  auto check_targets = [what, R, V](const int32_t* t) {
    if (t)
      for (int64_t r = 0; r < R; ++r)
        if (t[r] < 0 || t[r] >= V) fail("{}: target {} at row {} is outside the vocabulary [0, {})", what, t[r], r, V);
  };
  auto write_forward = [cx, id, od, op, R](const RowStats& rs, const int32_t* t) {
    for (int64_t r = 0; r < R; ++r) {
      const float v = op == Op::Entropy ? rs.ent[static_cast<size_t>(r)]
                      : op == Op::TokenLogprobs ? rs.target[static_cast<size_t>(r)] - rs.lse[static_cast<size_t>(r)]
                                                : (rs.arg[static_cast<size_t>(r)] == t[r] ? 1.0f : 0.0f);
      st(cx->p(id), od, r, v);
    }
  };
  // A forward node whose pass an earlier sibling already makes: copy the values out.
  if (!backward) {
    const auto it = passes.groups.find({h, w});
    if (it != passes.groups.end() && (tg == kNone || it->second.targets == tg)) {
      auto stats = it->second.stats;
      return [=] {
        const int32_t* t = tg != kNone ? static_cast<const int32_t*>(cx->p(tg)) : nullptr;
        write_forward(*stats, t);
      };
    }
  }
  // What the pass computes: for a forward node, everything its later siblings on (h, w) read.
  bool want_ent = entropy, want_arg = op == Op::TokenArgmaxMatch;
  graph::ValueId group_tg = tg;
  if (!backward) {
    for (size_t j = static_cast<size_t>(id) + 1; j < cx->graph().nodes.size(); ++j) {
      const Node& s2 = cx->graph().nodes[j];
      if ((s2.op != Op::TokenLogprobs && s2.op != Op::Entropy && s2.op != Op::TokenArgmaxMatch) || s2.inputs[0] != h || s2.inputs[1] != w) continue;
      const graph::ValueId t2 = s2.op == Op::Entropy ? kNone : s2.inputs[2];
      // Other targets, or targets computed after this node: a pass of its own.
      if (t2 != kNone && ((group_tg != kNone && t2 != group_tg) || t2 > id)) continue;
      if (t2 != kNone) group_tg = t2;
      want_ent = want_ent || s2.op == Op::Entropy;
      want_arg = want_arg || s2.op == Op::TokenArgmaxMatch;
    }
  }
  // logits chunk = h[R,C] · w[j0:j0+c, C]ᵀ ; the last chunk may be shorter.
  const DType hw = dh == dw ? dh : DType::F32;
  auto full = std::make_shared<Gemm>(R, chunk, C, hw, C, 1, hw, 1, C, DType::F32, false, false);
  const int64_t tail = V % chunk;
  auto last = tail ? std::make_shared<Gemm>(R, tail, C, hw, C, 1, hw, 1, C, DType::F32, false, false) : nullptr;
  // The [R, chunk] logits (and, backward in bf16, dz) buffers live in the arena's scratch, not on the heap: a
  // trainer caching a program per length then holds one copy of them, not one per program.
  const size_t logits_at = cx->reserve_scratch(static_cast<size_t>(R * chunk) * sizeof(float));
  auto hbuf = std::make_shared<std::vector<float>>(dh != dw ? static_cast<size_t>(R * C) : 0);
  auto wbuf = std::make_shared<std::vector<float>>(dh != dw ? static_cast<size_t>(chunk * C) : 0);
  std::shared_ptr<RowStats> stats;
  bool shared = false;
  if (!backward) {
    stats = std::make_shared<RowStats>();
    passes.groups[{h, w}] = PassGroup{group_tg, stats};
    if (group_tg != kNone) passes.saved[{h, w, group_tg}] = stats;
    if (want_ent) passes.saved[{h, w, graph::ValueId{-2}}] = stats;
  } else if (auto it = passes.saved.find({h, w, entropy ? graph::ValueId{-2} : tg}); it != passes.saved.end()) {
    stats = it->second;  // the forward node runs earlier in the same program
    shared = true;
  } else {
    stats = std::make_shared<RowStats>();
  }
  for (auto* v : {&stats->lse, &stats->ent, &stats->target}) v->resize(static_cast<size_t>(R));
  stats->arg.resize(static_cast<size_t>(R));
  // A bf16 model's logits are rounded to bf16 before the loss, so keeping them in bf16 is exact: when a backward
  // node of this pass follows, the forward keeps every chunk in the arena's scratch and the backward reads it
  // back instead of recomputing the lm_head GEMM (R·V·2 bytes, e.g. 311 MB for 1024 rows of Qwen3).
  if (!backward && dh == DType::BF16 && dw == DType::BF16) {
    for (size_t j = static_cast<size_t>(id) + 1; j < cx->graph().nodes.size() && stats->saved < 0; ++j) {
      const Node& s2 = cx->graph().nodes[j];
      const bool match = s2.inputs.size() >= 3 && s2.inputs[0] == h && s2.inputs[1] == w &&
                         ((s2.op == Op::TokenLogprobsBackward && group_tg != kNone && s2.inputs[2] == group_tg) || (s2.op == Op::EntropyBackward && want_ent));
      if (match) {
        stats->saved = static_cast<int64_t>(cx->reserve_scratch(static_cast<size_t>(R * V) * 2));
      }
    }
  }
  std::shared_ptr<Gemm> dh_full, dh_last, dw_full, dw_last;
  const bool to16 = backward && hw == DType::BF16;
  const size_t dz16_at = to16 ? cx->reserve_scratch(static_cast<size_t>(R * chunk) * sizeof(uint16_t)) : 0;
  if (backward) {
    dh_full = std::make_shared<Gemm>(R, C, chunk, hw, chunk, 1, hw, C, 1, DType::F32, false, true);
    dw_full = std::make_shared<Gemm>(chunk, C, R, hw, 1, chunk, hw, C, 1, DType::F32, false, false);
    if (tail) {
      dh_last = std::make_shared<Gemm>(R, C, tail, hw, tail, 1, hw, C, 1, DType::F32, false, true);
      dw_last = std::make_shared<Gemm>(tail, C, R, hw, 1, tail, hw, C, 1, DType::F32, false, false);
    }
  }
  return [=] {
    float* lg = reinterpret_cast<float*>(cx->scratch(logits_at));
    uint16_t* dz16 = to16 ? reinterpret_cast<uint16_t*>(cx->scratch(dz16_at)) : nullptr;
    const int32_t* t = tg != kNone ? static_cast<const int32_t*>(cx->p(tg)) : nullptr;
    // The pass's targets: this node's, or (an entropy node leading the group) a later sibling's.
    const int32_t* pt = group_tg != kNone ? static_cast<const int32_t*>(cx->p(group_tg)) : nullptr;
    check_targets(pt);
    const char* hp = static_cast<const char*>(cx->p(h));
    if (!hbuf->empty()) {
      for (int64_t i = 0; i < R * C; ++i) (*hbuf)[static_cast<size_t>(i)] = ld(hp, dh, i);
      hp = reinterpret_cast<const char*>(hbuf->data());
    }
    auto chunk_logits = [&](int64_t j0, int64_t c) {
      const char* wp = static_cast<const char*>(cx->p(w)) + j0 * C * static_cast<int64_t>(dtype_size(dw));
      if (!wbuf->empty()) {
        for (int64_t i = 0; i < c * C; ++i) (*wbuf)[static_cast<size_t>(i)] = ld(wp, dw, i);
        wp = reinterpret_cast<const char*>(wbuf->data());
      }
      (c == chunk ? full : last)->run(hp, wp, lg);
    };
    // Logits are stored in the model dtype before the f32 loss (as Transformers does for a bf16 model).
    auto round_row = [dh](float* z, int64_t c) {
      if (dh == DType::BF16) vec::round_to_bf16(z, c);
      else if (dh != DType::F32)
        for (int64_t j = 0; j < c; ++j) z[j] = rnd(dh, z[j]);
    };
    float* lse = stats->lse.data();
    float* ent = stats->ent.data();
    if (!(backward && shared)) {
      // Pass 1: running max (and its first index), Σ e^(z-m) (and Σ e^(z-m)·z) per row, and the target logit.
      std::vector<float> mx(static_cast<size_t>(R), -INFINITY), sum(static_cast<size_t>(R), 0.0f), tz(static_cast<size_t>(R), 0.0f);
      float* target = stats->target.data();
      int32_t* arg = stats->arg.data();
      uint16_t* keep = stats->saved >= 0 && !backward ? reinterpret_cast<uint16_t*>(cx->scratch(static_cast<size_t>(stats->saved))) : nullptr;
      for (int64_t j0 = 0; j0 < V; j0 += chunk) {
        const int64_t c = std::min(chunk, V - j0);
        chunk_logits(j0, c);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < R; ++r) {
          float* z = lg + r * c;
          round_row(z, c);
          if (keep) vec::bf16_bits(z, c, keep + R * j0 + r * c);  // exact: z is already bf16
          if (pt && pt[r] >= j0 && pt[r] < j0 + c) target[r] = z[pt[r] - j0];
          float cm = -INFINITY;
          for (int64_t j = 0; j < c; ++j) cm = std::max(cm, z[j]);
          const float old = mx[static_cast<size_t>(r)], m = std::max(old, cm);
          if (want_arg && (cm > old || j0 == 0)) arg[r] = static_cast<int32_t>(j0 + (std::find(z, z + c, cm) - z));
          const float rescale = old == -INFINITY ? 0.0f : std::exp(old - m);
          // z ← e^(z-m) in place (the chunk is recomputed when needed again); Σ e^(z-m)·z = ey + m·Σ e^(z-m).
          float ey = 0;
          const float se = want_ent ? vec::exp_shift_sum_ey(z, c, m, &ey) : vec::exp_shift_sum(z, c, m);
          if (want_ent) tz[static_cast<size_t>(r)] = tz[static_cast<size_t>(r)] * rescale + ey + m * se;
          mx[static_cast<size_t>(r)] = m;
          sum[static_cast<size_t>(r)] = sum[static_cast<size_t>(r)] * rescale + se;
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        lse[r] = mx[static_cast<size_t>(r)] + std::log(sum[static_cast<size_t>(r)]);
        ent[r] = lse[r] - tz[static_cast<size_t>(r)] / sum[static_cast<size_t>(r)];
      }
      if (!backward) {
        write_forward(*stats, t);
        return;
      }
    }
    // Pass 2: dz per chunk; dh = Σ dz·w_chunk (accumulated by the GEMM), dw_chunk = dzᵀ·h.
    float* out = static_cast<float*>(cx->p(id));  // packed [dh | dw], f32
    std::fill(out, out + R * C, 0.0f);
    const uint16_t* kept = shared && stats->saved >= 0 ? reinterpret_cast<const uint16_t*>(cx->scratch(static_cast<size_t>(stats->saved))) : nullptr;
    for (int64_t j0 = 0; j0 < V; j0 += chunk) {
      const int64_t c = std::min(chunk, V - j0);
      if (!kept) chunk_logits(j0, c);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        const float g = ld(cx->p(dl), dd, r);
        float* z = lg + r * c;
        uint16_t* z16 = to16 ? dz16 + r * c : nullptr;
        if (kept) {
          const uint16_t* k = kept + R * j0 + r * c;
          for (int64_t j = 0; j < c; ++j) z[j] = bf16_to_f32(k[j]);
        } else {
          round_row(z, c);
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
          for (int64_t j = 0; j < c; ++j) z16[j] = f32_to_bf16(-g * z[j]);
          if (hit) z16[t[r] - j0] = f32_to_bf16(g * (1.0f - z[t[r] - j0]));
        } else {
          for (int64_t j = 0; j < c; ++j) z[j] = -g * z[j];
          if (hit) z[t[r] - j0] += g;
        }
      }
      const void* dz = to16 ? static_cast<const void*>(dz16) : static_cast<const void*>(lg);
      const char* wp = static_cast<const char*>(cx->p(w)) + j0 * C * static_cast<int64_t>(dtype_size(dw));
      if (!wbuf->empty()) {  // mixed dtypes: the chunk was widened into wbuf by chunk_logits
        wp = reinterpret_cast<const char*>(wbuf->data());
      }
      (c == chunk ? dh_full : dh_last)->run(dz, wp, out);
      (c == chunk ? dw_full : dw_last)->run(dz, hp, out + R * C + j0 * C);
    }
  };
}

}  // namespace trl::cpu

// Attention and AttentionBackward on the CPU: flash-style blocks of GEMMs, and a decode path at cache positions.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/lower.h"
#include "backend/cpu/vec.h"
#include "core/cpu_features.h"
#include "trl/core/error.h"

namespace trl::cpu {
namespace {

// Flash-style attention forward and backward with GEMMs. One task per (batch, kv head); the queries of each head
// are taken in blocks of kQueryBlock rows, and a block multiplies only the keys it may see: with a causal mask
// query t sees keys up to t + S - T, so the upper triangle is skipped (about half the work at T = S). The GEMMs
// read Q, K, V and dO in place from their [B, T, H, D] layout (strided operands, in the model's dtype: bf16 or
// f32, accumulated in f32) and write O and dQ in place; scores and softmax statistics are f32. A block's scores
// [rows, keys] are the only temporary — the [T, S] square is never held. Forward rounding follows eager
// Transformers for a bf16 model (scores and probabilities stored in bf16); the backward pass recomputes the same
// probabilities, forms dS = P∘(dP - Σ P∘dP)·scale in f32 and feeds the GEMMs of dQ, dK, dV in the compute dtype,
// as autocast's bf16 matmul backward does. dK, dV of the query heads that share a kv head accumulate in f32.
static constexpr int64_t kQueryBlock = 64;
Kernel attention_blocks(ProgramContext* cx, graph::ValueId id, bool backward) {
  const Node& n = cx->nd(id);
  const graph::ValueId q = n.inputs[0], k = n.inputs[1], v = n.inputs[2], mask = n.inputs[3], dy = backward ? n.inputs[4] : kNone;
  const Shape& qs = cx->nd(q).shape;
  const Shape& ks = cx->nd(k).shape;
  const int64_t B = qs[0], T = qs[1], H = qs[2], D = qs[3], S = ks[1], Hkv = ks[2];
  const DType dq = cx->nd(q).dtype, dk = cx->nd(k).dtype, dv = cx->nd(v).dtype, dd = backward ? cx->nd(dy).dtype : dq, od = n.dtype;
  // The GEMMs' dtype: the inputs' own when they agree (bf16 or f32), else f32 (operands converted per task).
  const bool same = dq == dk && dk == dv && dd == dq && (dq == DType::F32 || dq == DType::BF16);
  const DType ct = same ? dq : DType::F32;
  const DType ot = od == DType::F32 || od == DType::BF16 ? od : DType::F32;  // O / dQ written directly when possible
  const bool direct_out = ot == od;
  const float scale = static_cast<float>(n.attrs.scale);
  const bool causal = n.attrs.causal;
  const int64_t nq = B * T * H * D, nk = B * S * Hkv * D, offset = S - T;
  // Row strides of Q/dO, K/V and O/dQ as the GEMMs see them (in place, or per-task contiguous copies).
  const int64_t ldq = same ? H * D : D, ldk = same ? Hkv * D : D, ldo = direct_out ? H * D : D;
  struct Block {
    int64_t t0, rows, keys;
    std::shared_ptr<Gemm> qk, pv, dp, dq, dk, dv;
  };
  auto blocks = std::make_shared<std::vector<Block>>();
  const DType f = DType::F32;
  for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
    Block bl;
    bl.t0 = t0;
    bl.rows = std::min(kQueryBlock, T - t0);
    bl.keys = causal ? std::clamp<int64_t>(t0 + bl.rows + offset, 0, S) : S;
    const int64_t R = bl.rows, L = bl.keys;
    if (L > 0) {
      bl.qk = std::make_shared<Gemm>(R, L, D, ct, ldq, 1, ct, 1, ldk, f, false, false);  // S = Q·Kᵀ      [R, L] f32
      if (!backward) {
        bl.pv = std::make_shared<Gemm>(R, D, L, ct, L, 1, ct, ldk, 1, ot, false, false, ldo);  // O = P·V  [R, D]
      } else {
        bl.dp = std::make_shared<Gemm>(R, L, D, ct, ldq, 1, ct, 1, ldk, f, false, false);            // dP = dO·Vᵀ
        bl.dq = std::make_shared<Gemm>(R, D, L, ct, L, 1, ct, ldk, 1, ot, false, false, ldo);        // dQ = dS·K
        bl.dk = std::make_shared<Gemm>(L, D, R, ct, 1, L, ct, ldq, 1, f, false, true);               // dK += dSᵀ·Q
        bl.dv = std::make_shared<Gemm>(L, D, R, ct, 1, L, ct, ldq, 1, f, false, true);               // dV += Pᵀ·dO
      }
    }
    blocks->push_back(std::move(bl));
  }
  const size_t es = dtype_size(ct);
  return [cx, id, q, k, v, mask, dy, B, T, H, D, S, Hkv, dq, dk, dv, dd, od, ct, same, direct_out, scale, causal, backward, nq, nk,
          offset, ldq, ldo, blocks, es] {
    const int64_t rep = H / Hkv;
    const int32_t* m = mask != kNone ? static_cast<const int32_t*>(cx->p(mask)) : nullptr;
    char* out = static_cast<char*>(cx->p(id));
#pragma omp parallel for schedule(dynamic)
    for (int64_t bh = 0; bh < B * Hkv; ++bh) {
      const int64_t b = bh / Hkv, hk = bh % Hkv;
      thread_local std::vector<float> Sc, dP, dK, dV, Ot;
      thread_local std::vector<char> P16, dS16, Kc, Vc, Qc, Gc;
      Sc.resize(static_cast<size_t>(kQueryBlock * S));
      P16.resize(static_cast<size_t>(kQueryBlock * S) * es);
      // Operands: in place when their dtype is the compute dtype, else converted to contiguous f32 per task.
      auto gather = [&](std::vector<char>& buf, graph::ValueId x, DType xd, int64_t rows, int64_t heads, int64_t head) -> const char* {
        buf.resize(static_cast<size_t>(rows * D) * sizeof(float));
        float* o = reinterpret_cast<float*>(buf.data());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < D; ++d) o[r * D + d] = ld(cx->p(x), xd, ((b * rows + r) * heads + head) * D + d);
        return buf.data();
      };
      const char* K = same ? static_cast<const char*>(cx->p(k)) + static_cast<size_t>(((b * S) * Hkv + hk) * D) * es : gather(Kc, k, dk, S, Hkv, hk);
      const char* V = same ? static_cast<const char*>(cx->p(v)) + static_cast<size_t>(((b * S) * Hkv + hk) * D) * es : gather(Vc, v, dv, S, Hkv, hk);
      if (backward) {
        dP.resize(static_cast<size_t>(kQueryBlock * S));
        dS16.resize(static_cast<size_t>(kQueryBlock * S) * es);
        dK.assign(static_cast<size_t>(S * D), 0.0f);
        dV.assign(static_cast<size_t>(S * D), 0.0f);
      }
      if (!direct_out) Ot.resize(static_cast<size_t>(T * D));
      for (int64_t h = hk * rep; h < (hk + 1) * rep; ++h) {
        const char* Q = same ? static_cast<const char*>(cx->p(q)) + static_cast<size_t>(((b * T) * H + h) * D) * es : gather(Qc, q, dq, T, H, h);
        const char* G = !backward ? nullptr
                        : same    ? static_cast<const char*>(cx->p(dy)) + static_cast<size_t>(((b * T) * H + h) * D) * es
                                  : gather(Gc, dy, dd, T, H, h);
        char* O = direct_out ? out + static_cast<size_t>(((b * T) * H + h) * D) * dtype_size(od) : reinterpret_cast<char*>(Ot.data());
        for (const Block& bl : *blocks) {
          const int64_t R = bl.rows, L = bl.keys;
          char* Ob = O + static_cast<size_t>(bl.t0 * ldo) * dtype_size(direct_out ? od : DType::F32);
          if (L == 0) {  // no visible key: the rows are zero
            for (int64_t r = 0; r < R; ++r) std::memset(Ob + static_cast<size_t>(r * ldo) * dtype_size(direct_out ? od : DType::F32), 0, static_cast<size_t>(D) * dtype_size(direct_out ? od : DType::F32));
            continue;
          }
          const char* Qb = Q + static_cast<size_t>(bl.t0 * ldq) * es;
          bl.qk->run(Qb, K, Sc.data());
          // Row-wise masked softmax of scale·scores → P (f32 in Sc, and in the compute dtype in P16).
          const bool b16 = ct == DType::BF16;
          for (int64_t r = 0; r < R; ++r) {
            const int64_t t = bl.t0 + r;
            float* row = Sc.data() + r * L;
            uint16_t* p16 = b16 ? reinterpret_cast<uint16_t*>(P16.data()) + r * L : nullptr;
            const int64_t limit = causal ? std::min(L, t + offset + 1) : L;
            const int32_t seg = m ? m[b * S + t + offset] : 1;  // segment ids: 0 = padding, else the packed sequence
            // A padding query sees nothing; otherwise the keys of its own segment (padding keys are segment 0).
            const float mx = m && seg == 0 ? -INFINITY : vec::attention_scores(row, limit, scale, b16, m ? m + b * S : nullptr, seg);
            if (mx == -INFINITY) {
              std::fill(row, row + L, 0.0f);
              if (p16) std::fill(p16, p16 + L, uint16_t{0});
              continue;
            }
            const float inv = 1.0f / vec::exp_shift_sum(row, limit, mx);
            vec::scale_round(row, limit, inv, b16, p16);
            std::fill(row + limit, row + L, 0.0f);
            if (p16) std::fill(p16 + limit, p16 + L, uint16_t{0});
          }
          const char* Pc = ct == DType::BF16 ? P16.data() : reinterpret_cast<const char*>(Sc.data());
          if (!backward) {
            bl.pv->run(Pc, V, Ob);
            continue;
          }
          // dP = dO·Vᵀ; dS = P∘(dP - Σ_j P∘dP)·scale; dQ = dS·K; dK += dSᵀ·Q; dV += Pᵀ·dO.
          const char* Gb = G + static_cast<size_t>(bl.t0 * ldq) * es;
          bl.dp->run(Gb, V, dP.data());
          for (int64_t r = 0; r < R; ++r)
            vec::softmax_backward_row(Sc.data() + r * L, dP.data() + r * L, L, scale,
                                          ct == DType::BF16 ? reinterpret_cast<uint16_t*>(dS16.data()) + r * L : nullptr);
          const char* dS = ct == DType::BF16 ? dS16.data() : reinterpret_cast<const char*>(dP.data());
          bl.dq->run(dS, K, Ob);
          bl.dk->run(dS, Qb, dK.data());
          bl.dv->run(Pc, Gb, dV.data());
        }
        if (!direct_out)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t d = 0; d < D; ++d) st(out, od, ((b * T + t) * H + h) * D + d, Ot[static_cast<size_t>(t * D + d)]);
      }
      if (backward) {
        for (int64_t j = 0; j < S; ++j) {
          const int64_t kb = ((b * S + j) * Hkv + hk) * D;
          for (int64_t d = 0; d < D; ++d) {
            st(out, od, nq + kb + d, dK[static_cast<size_t>(j * D + d)]);
            st(out, od, nq + nk + kb + d, dV[static_cast<size_t>(j * D + d)]);
          }
        }
      }
    }
  };
}

// Attention of queries placed at given key positions (q_pos: a static KV cache's cache positions), for decoding:
// a query at key index p sees keys 0..p (causal) of its own segment. One task per (batch, head); scores are dot
// products against the cached keys in their dtype, the softmax is f32 with the forward rounding of a bf16 model,
// and the output is the probability-weighted sum of the cached values. Keys after p are never read.
Kernel attention_at_positions(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const graph::ValueId q = n.inputs[0], k = n.inputs[1], v = n.inputs[2], mask = n.inputs[3], qpos = n.inputs[4];
  const graph::ValueId rows = n.inputs.size() > 5 ? n.inputs[5] : kNone;
  const Shape& qs = cx->nd(q).shape;
  const Shape& ks = cx->nd(k).shape;
  const int64_t B = qs[0], T = qs[1], H = qs[2], D = qs[3], S = ks[1], Hkv = ks[2], Bc = ks[0];
  const DType dq = cx->nd(q).dtype, dk = cx->nd(k).dtype, dv = cx->nd(v).dtype, od = n.dtype;
  const float scale = static_cast<float>(n.attrs.scale);
  const bool causal = n.attrs.causal;
  const std::string name = n.name;
  return [cx, id, q, k, v, mask, qpos, rows, B, T, H, D, S, Hkv, Bc, dq, dk, dv, od, scale, causal, name] {
    const int32_t* qp = static_cast<const int32_t*>(cx->p(qpos));
    const int32_t* m = mask != kNone ? static_cast<const int32_t*>(cx->p(mask)) : nullptr;
    const int32_t* cr = rows != kNone ? static_cast<const int32_t*>(cx->p(rows)) : nullptr;
    for (int64_t i = 0; i < B * T; ++i)
      if (qp[i] < 0 || qp[i] >= S) fail("attention {}: query position {} (row {}, token {}) is outside the {} cached keys", name, qp[i], i / T, i % T, S);
    for (int64_t b = 0; cr && b < B; ++b)
      if (cr[b] < 0 || cr[b] >= Bc) fail("attention {}: cache row {} (query row {}) is outside the cache's {} rows", name, cr[b], b, Bc);
    const int64_t rep = H / Hkv;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, hk = h / rep, kb_row = cr ? cr[b] : b;  // the cache row this query row reads
      thread_local std::vector<float> sc, qv, kv, acc;
      sc.resize(static_cast<size_t>(S)), qv.resize(static_cast<size_t>(D)), kv.resize(static_cast<size_t>(D)), acc.resize(static_cast<size_t>(D));
      for (int64_t t = 0; t < T; ++t) {
        const int64_t pos = qp[b * T + t], qb = ((b * T + t) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) qv[static_cast<size_t>(d)] = ld(cx->p(q), dq, qb + d);
        const int64_t limit = causal ? pos + 1 : S;
        const int32_t seg = m ? m[b * S + pos] : 1;
        float mx = -INFINITY;
        for (int64_t j = 0; j < limit; ++j) {
          if (m && (m[b * S + j] == 0 || m[b * S + j] != seg)) {
            sc[static_cast<size_t>(j)] = -INFINITY;
            continue;
          }
          const int64_t kb = ((kb_row * S + j) * Hkv + hk) * D;
          float dot;
          if (dk == DType::BF16) dot = vec::dot_bf16(qv.data(), static_cast<const uint16_t*>(cx->p(k)) + kb, D);
          else if (dk == DType::F32) dot = vec::dot(qv.data(), static_cast<const float*>(cx->p(k)) + kb, D);
          else {
            for (int64_t d = 0; d < D; ++d) kv[static_cast<size_t>(d)] = ld(cx->p(k), dk, kb + d);
            dot = vec::dot(qv.data(), kv.data(), D);
          }
          sc[static_cast<size_t>(j)] = rnd(dq, rnd(dq, dot) * scale);
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        if (mx != -INFINITY) {
          vec::exp_shift(sc.data(), limit, mx);
          const float inv = 1.0f / vec::sum(sc.data(), limit);
          for (int64_t j = 0; j < limit; ++j) {
            const float pj = rnd(dq, sc[static_cast<size_t>(j)] * inv);
            if (pj == 0.0f) continue;
            const int64_t vb = ((kb_row * S + j) * Hkv + hk) * D;
            if (dv == DType::BF16) vec::axpy_bf16(acc.data(), pj, static_cast<const uint16_t*>(cx->p(v)) + vb, D);
            else
              for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += pj * ld(cx->p(v), dv, vb + d);
          }
        }
        for (int64_t d = 0; d < D; ++d) st(cx->p(id), od, qb + d, acc[static_cast<size_t>(d)]);
      }
    }

  };
}

}  // namespace

Kernel lower_attention(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  if (n.inputs.size() > 4 && n.inputs[4] != kNone) return attention_at_positions(cx, id);
  return attention_blocks(cx, id, false);
}

Kernel lower_attention_backward(ProgramContext* cx, graph::ValueId id) { return attention_blocks(cx, id, true); }

}  // namespace trl::cpu

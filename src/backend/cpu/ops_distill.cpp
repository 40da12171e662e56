// The distillation ops on the CPU (graph::Op::Jsd, JsdBackward): TRL's generalized Jensen-Shannon divergence
// between a student's next-token distribution and a teacher's. Shapes: h:[R,C], w:[V,C] (the student), ht:[R,Ct],
// wt:[V,Ct] (the teacher, in its own dtype), leading dims flattened.
//
// Both models' logits are formed [R, 4096] columns at a time (logits_head.h), never [R, V]; each side's are rounded
// to its own dtype, as each model's lm_head output is. With zs, zt a chunk's logits, ls = zs − lse, lt = zt − lse_t
// the log-probabilities, S = e^ls, T = e^lt and log M = log((1 − β)·S + β·T) (a log-add-exp):
// - jsd, pass 1: per row a running max and Σ e^(z − max) of each side (rescaled when the max grows), giving lse and
//   lse_t; for β = 0 also Σ e^(zt − max_t)·(zt − zs), for β = 1 Σ e^(zs − max)·(zs − zt), which give the KL in the
//   same pass: KL(T‖S) = E_T[zt − zs] − lse_t + lse. Any other β needs the normalised probabilities, so pass 2 forms
//   the logits again and sums kl_t = Σ T·(lt − log M), kl_s = Σ S·(ls − log M): jsd = β·kl_t + (1 − β)·kl_s.
// - jsd_backward reads lse, lse_t and kl_s (or the KL) from the jsd node and forms the logits once more; with g the
//   row's incoming gradient, dL/dzs is
//     β = 0:  g·(S − T);   β = 1:  g·S·(ls − lt − KL(S‖T));   else  g·(1 − β)·S·(ls − log M − KL(S‖M))
//   (for the mixture, ∂J/∂S_j = (1 − β)(log S_j − log M_j); softmax's Jacobian subtracts its S-weighted mean), in the
//   GEMM type, then dh += dz·w_chunk and dw_chunk = dzᵀ·h, in f32. The teacher gets no gradient.
// The row loops are vec::jsd_pass1_row, jsd_pass2_row and jsd_grad_row (vectorised exp and log); the row constants
// are kept as hi + lo f32 pairs (graph::JsdStat), so that an lse's f32 rounding does not shift a whole row.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/logits_head.h"
#include "backend/cpu/lower.h"
#include "backend/cpu/vec.h"
#include "trl/core/error.h"

namespace trl::cpu {

namespace {

using graph::JsdStat;
constexpr int64_t kRows = graph::kJsdStatRows;

// The student's and the teacher's heads of one jsd node.
struct JsdHeads {
  LogitsHead s, t;
  double beta = 0;
};

JsdHeads make_heads(ProgramContext* cx, const Node& n) {
  JsdHeads j{make_head(cx, n, n.inputs[0], n.inputs[1]), make_head(cx, n, n.inputs[2], n.inputs[3]), n.attrs.value};
  if (j.s.split.split()) fail("cpu backend: {} under a vocabulary split is not supported", graph::op_name(n.op));
  return j;
}

// A row constant as hi + lo f32 rows (graph::JsdStat).
void put_stat(float* out, int64_t R, int64_t r, JsdStat k, double v) {
  const float hi = static_cast<float>(v);
  out[static_cast<int64_t>(k) * R + r] = hi;
  out[(static_cast<int64_t>(k) + 3) * R + r] = static_cast<float>(v - hi);
}

// Row r's statistics of pass 1 over every chunk: lse, lse_t and (β 0 or 1) the KL.
struct Pass1 {
  std::vector<double> m, s, mt, st, a;  // running maxima, Σ e^(z − m), Σ e^(zt − mt), the KL's weighted sum
};

void pass1(const ProgramContext* cx, const JsdHeads& j, const char* hp, const char* tp, ValueId w, ValueId wt, float* lgs, float* lgt, float* out) {
  const int64_t R = j.s.R, V = j.s.V, chunk = j.s.chunk;
  const bool fwd_kl = j.beta == 0, rev_kl = j.beta == 1;
  Pass1 p{std::vector<double>(static_cast<size_t>(R), -INFINITY), std::vector<double>(static_cast<size_t>(R), 0.0),
          std::vector<double>(static_cast<size_t>(R), -INFINITY), std::vector<double>(static_cast<size_t>(R), 0.0),
          std::vector<double>(static_cast<size_t>(R), 0.0)};
  for (int64_t j0 = 0; j0 < V; j0 += chunk) {
    const int64_t c = std::min(chunk, V - j0);
    j.s.logits(cx, hp, w, j0, c, lgs);
    j.t.logits(cx, tp, wt, j0, c, lgt);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const size_t i = static_cast<size_t>(r);
      float *zs = lgs + r * c, *zt = lgt + r * c;
      j.s.round_row(zs, c);
      j.t.round_row(zt, c);
      const float cs = vec::max(zs, c), ct = vec::max(zt, c);
      const double ms = std::max(p.m[i], static_cast<double>(cs)), mt = std::max(p.mt[i], static_cast<double>(ct));
      const double rs = p.m[i] == -INFINITY ? 0.0 : std::exp(p.m[i] - ms), rt = p.mt[i] == -INFINITY ? 0.0 : std::exp(p.mt[i] - mt);
      double ss = 0, st = 0, a = 0;
      vec::jsd_pass1_row(zs, zt, c, static_cast<float>(ms), static_cast<float>(mt), fwd_kl ? 0 : rev_kl ? 1 : 2, &ss, &st, &a);
      p.s[i] = p.s[i] * rs + ss, p.st[i] = p.st[i] * rt + st;
      if (fwd_kl) p.a[i] = p.a[i] * rt + a;
      else if (rev_kl) p.a[i] = p.a[i] * rs + a;
      p.m[i] = ms, p.mt[i] = mt;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const size_t i = static_cast<size_t>(r);
    const double ls = p.m[i] + std::log(p.s[i]), lt = p.mt[i] + std::log(p.st[i]);
    double value = 0, kl = 0;
    if (fwd_kl) value = p.a[i] / p.st[i] - lt + ls;
    if (rev_kl) value = kl = p.a[i] / p.s[i] - ls + lt;
    out[r] = static_cast<float>(value);
    put_stat(out, R, r, JsdStat::Lse, ls);
    put_stat(out, R, r, JsdStat::LseTeacher, lt);
    put_stat(out, R, r, JsdStat::KlStudentMixture, kl);
  }
}

// A row's log-probabilities from its logits and the stats' hi + lo log-sum-exps, and dl = lse_t − lse.
struct RowShift {
  float shift[5];  // lse hi, lse lo, lse_t hi, lse_t lo, lse_t − lse (vec::jsd_pass2_row, jsd_grad_row)
  RowShift(const float* st, int64_t R, int64_t r) {
    double whole[2];
    for (int k = 0; k < 2; ++k) {
      const int64_t row = static_cast<int64_t>(k == 0 ? JsdStat::Lse : JsdStat::LseTeacher);
      shift[2 * k] = st[row * R + r], shift[2 * k + 1] = st[(row + 3) * R + r];
      whole[k] = static_cast<double>(shift[2 * k]) + shift[2 * k + 1];
    }
    shift[4] = static_cast<float>(whole[1] - whole[0]);
  }
};

// Pass 2 (0 < β < 1): kl_t and kl_s over the normalised distributions.
void pass2(const ProgramContext* cx, const JsdHeads& j, const char* hp, const char* tp, ValueId w, ValueId wt, float* lgs, float* lgt, float* out) {
  const int64_t R = j.s.R, V = j.s.V, chunk = j.s.chunk;
  const float beta = static_cast<float>(j.beta);
  std::vector<double> kt(static_cast<size_t>(R), 0.0), ks(static_cast<size_t>(R), 0.0);
  for (int64_t j0 = 0; j0 < V; j0 += chunk) {
    const int64_t c = std::min(chunk, V - j0);
    j.s.logits(cx, hp, w, j0, c, lgs);
    j.t.logits(cx, tp, wt, j0, c, lgt);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      float *zs = lgs + r * c, *zt = lgt + r * c;
      j.s.round_row(zs, c);
      j.t.round_row(zt, c);
      const RowShift sh(out, R, r);
      double at = 0, as = 0;
      vec::jsd_pass2_row(zs, zt, c, sh.shift, beta, &at, &as);
      kt[static_cast<size_t>(r)] += at, ks[static_cast<size_t>(r)] += as;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const size_t i = static_cast<size_t>(r);
    out[r] = static_cast<float>(j.beta * kt[i] + (1 - j.beta) * ks[i]);
    put_stat(out, R, r, JsdStat::KlStudentMixture, ks[i]);
  }
}

}  // namespace

// jsd: h, w, ht, wt -> packed f32 [jsd | lse, lse_t, kl_sm (hi) | the same (lo)].
Kernel lower_jsd(ProgramContext* cx, ValueId id) {
  const Node& n = cx->nd(id);
  if (n.dtype != DType::F32) fail("cpu backend: jsd produces f32, not {}", dtype_name(n.dtype));
  const JsdHeads j = make_heads(cx, n);
  const ValueId h = n.inputs[0], w = n.inputs[1], ht = n.inputs[2], wt = n.inputs[3];
  return [=] {
    const char* hp = j.s.h_input(cx, h);
    const char* tp = j.t.h_input(cx, ht);
    float* lgs = reinterpret_cast<float*>(cx->scratch(j.s.logits_at));
    float* lgt = reinterpret_cast<float*>(cx->scratch(j.t.logits_at));
    float* out = static_cast<float*>(cx->p(id));
    pass1(cx, j, hp, tp, w, wt, lgs, lgt, out);
    if (j.beta != 0 && j.beta != 1) pass2(cx, j, hp, tp, w, wt, lgs, lgt, out);
  };
}

// jsd_backward: h, w, ht, wt, djsd, stats -> packed f32 [dh:[R,C] | dw:[V,C]] (dh alone with attrs.dh_only).
Kernel lower_jsd_backward(ProgramContext* cx, ValueId id) {
  const Node& n = cx->nd(id);
  if (n.dtype != DType::F32) fail("cpu backend: jsd_backward produces f32 gradients, not {}", dtype_name(n.dtype));
  const JsdHeads j = make_heads(cx, n);
  const ValueId h = n.inputs[0], w = n.inputs[1], ht = n.inputs[2], wt = n.inputs[3], dj = n.inputs[4], stats_in = n.inputs[5];
  const int64_t R = j.s.R, C = j.s.C, V = j.s.V, chunk = j.s.chunk;
  const DType dd = cx->nd(dj).dtype;
  const bool dh_only = n.attrs.dh_only;
  const HeadGradGemms gg = make_grad_gemms(cx, j.s);
  const bool to16 = gg.to16;
  return [=] {
    const char* hp = j.s.h_input(cx, h);
    const char* tp = j.t.h_input(cx, ht);
    const float* st = static_cast<const float*>(cx->p(stats_in));
    const float* kl_hi = st + static_cast<int64_t>(JsdStat::KlStudentMixture) * R;
    const float* kl_lo = st + (static_cast<int64_t>(JsdStat::KlStudentMixture) + 3) * R;
    float* lgs = reinterpret_cast<float*>(cx->scratch(j.s.logits_at));
    float* lgt = reinterpret_cast<float*>(cx->scratch(j.t.logits_at));
    uint16_t* dz16 = to16 ? reinterpret_cast<uint16_t*>(cx->scratch(gg.dz16_at)) : nullptr;
    float* out = static_cast<float*>(cx->p(id));
    std::fill(out, out + R * C, 0.0f);
    const float beta = static_cast<float>(j.beta);
    for (int64_t j0 = 0; j0 < V; j0 += chunk) {
      const int64_t c = std::min(chunk, V - j0);
      const char* wp = j.s.logits(cx, hp, w, j0, c, lgs);
      j.t.logits(cx, tp, wt, j0, c, lgt);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        const float g = ld(cx->p(dj), dd, r);
        float *z = lgs + r * c, *zt = lgt + r * c;
        if (g == 0) {
          std::fill(z, z + c, 0.0f);
        } else {
          j.s.round_row(z, c);
          j.t.round_row(zt, c);
          const RowShift sh(st, R, r);
          vec::jsd_grad_row(z, zt, c, sh.shift, beta, g, kl_hi[r], kl_lo[r]);
        }
        if (to16) vec::to_bf16(z, c, dz16 + r * c);
      }
      const void* dz = to16 ? static_cast<const void*>(dz16) : static_cast<const void*>(lgs);
      gg.run(dz, wp, hp, out, j0, c, dh_only);
    }
  };
}

}  // namespace trl::cpu

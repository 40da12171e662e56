// Mixture of experts on the CPU (graph::Op::MoeTopK ... MoeAuxLossBackward; shapes in graph.h).
//
// moe_experts groups the N·K (token, choice) slots by expert (a counting sort), gathers each expert's tokens into
// contiguous rows and runs the expert as GEMMs over them: H = X·gate_upᵀ [m, 2F], A = silu(H_gate)·H_up [m, F],
// O = A·downᵀ [m, C]; then each token sums its K rows of O weighted by its routing weights. An expert no token
// chose costs nothing. The number of rows m of an expert is known only at run time: an expert of more than 8 rows
// gets its rows padded with zero rows to a multiple of 16 and runs as GEMMs of 128/64/32/16 rows (oneDNN primitives
// made at compile time, gemm.h); one of at most 8 rows (decoding: one token, K experts of one row each) takes dot
// products that read each weight row once. With many experts busy the experts run in parallel (one thread each,
// its GEMMs sequential); with few, one after the other with parallel GEMMs.
// moe_experts_backward recomputes H, A and O per expert (as attention's backward recomputes P) and forms dx,
// the routing weights' gradient and, unless the experts are frozen, each expert's weight gradients (GEMMs whose
// depth is the expert's rows, padded to 16s with zero rows, in chunks accumulated into the result: one pass over
// an expert's gradient per 128 rows).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/lower.h"
#include "backend/cpu/vec.h"
#include "core/cpu_features.h"
#include "trl/core/error.h"

namespace trl::cpu {

namespace {

// ---- the router: small ops over [N, E], one row per task ----

// softmax of a row of E logits into p (f32, as Transformers computes the router's probabilities).
void softmax_row(const void* logits, DType dt, int64_t row, int64_t E, float* p) {
  float mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, ld(logits, dt, row * E + e));
  float sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(ld(logits, dt, row * E + e) - mx);
  const float inv = 1.0f / sum;
  for (int64_t e = 0; e < E; ++e) p[e] *= inv;
}

int32_t checked_expert(const int32_t* experts, int64_t i, int64_t E) {
  const int32_t e = experts[i];
  if (e < 0 || e >= E) fail("moe: expert {} at flat position {} is outside [0, {})", e, i, E);
  return e;
}

// Every expert index in range, checked before a parallel loop reads them (an error thrown inside an OpenMP region
// would end the process instead of reaching the caller).
void check_experts(const int32_t* experts, int64_t count, int64_t E) {
  for (int64_t i = 0; i < count; ++i) (void)checked_expert(experts, i, E);
}

Kernel router_kernel(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const Op op = n.op;
  const std::vector<graph::ValueId> in = n.inputs;
  const DType od = n.dtype;
  const bool normalize = n.attrs.normalize;
  if (op == Op::MoeAuxLoss || op == Op::MoeAuxLossBackward) {
    const DType sd = cx->nd(in[0]).dtype;
    const int64_t E = (shape_numel(cx->nd(in[0]).shape) - 1) / 2;
    return [cx, id, op, in, od, sd, E] {
      const void* s = cx->p(in[0]);
      const double tokens = ld(s, sd, 2 * E);
      if (op == Op::MoeAuxLoss) {
        double sum = 0;
        for (int64_t e = 0; e < E; ++e) sum += static_cast<double>(ld(s, sd, e)) * ld(s, sd, E + e);
        st(cx->p(id), od, 0, static_cast<float>(tokens > 0 ? static_cast<double>(E) * sum / (tokens * tokens) : 0.0));
        return;
      }
      const double g = ld(cx->p(in[1]), cx->nd(in[1]).dtype, 0);
      for (int64_t i = 0; i < 2 * E + 1; ++i) {
        const bool prob = i >= E && i < 2 * E;
        st(cx->p(id), od, i, static_cast<float>(prob && tokens > 0 ? g * static_cast<double>(E) * ld(s, sd, i - E) / (tokens * tokens) : 0.0));
      }
    };
  }
  const graph::ValueId logits = in[0];
  const DType lt = cx->nd(logits).dtype;
  const int64_t N = cx->nd(logits).shape[0], E = cx->nd(logits).shape[1];
  switch (op) {
    case Op::MoeTopK: {
      const int64_t K = n.attrs.rows;
      return [cx, id, logits, lt, N, E, K] {
        auto* out = static_cast<int32_t*>(cx->p(id));
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < N; ++r) {
          // Insertion into the K best so far: larger first, an equal value after the earlier (lower) index.
          int32_t* best = out + r * K;
          std::vector<float> val(static_cast<size_t>(K));
          int64_t have = 0;
          for (int64_t e = 0; e < E; ++e) {
            const float v = ld(cx->p(logits), lt, r * E + e);
            if (have == K && !(v > val[static_cast<size_t>(K - 1)])) continue;
            int64_t j = have < K ? have++ : K - 1;
            while (j > 0 && v > val[static_cast<size_t>(j - 1)]) {
              val[static_cast<size_t>(j)] = val[static_cast<size_t>(j - 1)];
              best[j] = best[j - 1];
              --j;
            }
            val[static_cast<size_t>(j)] = v;
            best[j] = static_cast<int32_t>(e);
          }
        }
      };
    }
    case Op::MoeRouteWeights:
    case Op::MoeRouteWeightsBackward: {
      const graph::ValueId experts = in[1], dw = op == Op::MoeRouteWeightsBackward ? in[2] : kNone;
      const int64_t K = cx->nd(experts).shape[1];
      const DType gd = dw != kNone ? cx->nd(dw).dtype : DType::F32;
      return [cx, id, op, logits, experts, dw, lt, gd, od, N, E, K, normalize] {
        const auto* ex = static_cast<const int32_t*>(cx->p(experts));
        check_experts(ex, N * K, E);
#pragma omp parallel
        {
          std::vector<float> p(static_cast<size_t>(E)), dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
          for (int64_t r = 0; r < N; ++r) {
            softmax_row(cx->p(logits), lt, r, E, p.data());
            double S = 0, dot = 0;
            for (int64_t k = 0; k < K; ++k) {
              const float pk = p[static_cast<size_t>(ex[r * K + k])];
              S += pk;
              if (op == Op::MoeRouteWeightsBackward) dot += static_cast<double>(ld(cx->p(dw), gd, r * K + k)) * pk;
            }
            if (op == Op::MoeRouteWeights) {
              for (int64_t k = 0; k < K; ++k) {
                const float w = p[static_cast<size_t>(ex[r * K + k])];
                st(cx->p(id), od, r * K + k, normalize ? static_cast<float>(w / S) : w);
              }
              continue;
            }
            std::fill(dp.begin(), dp.end(), 0.0f);
            for (int64_t k = 0; k < K; ++k) {
              const double g = ld(cx->p(dw), gd, r * K + k);
              dp[static_cast<size_t>(ex[r * K + k])] += static_cast<float>(normalize ? g / S - dot / (S * S) : g);
            }
            double mix = 0;
            for (int64_t e = 0; e < E; ++e) mix += static_cast<double>(dp[static_cast<size_t>(e)]) * p[static_cast<size_t>(e)];
            for (int64_t e = 0; e < E; ++e)
              st(cx->p(id), od, r * E + e, static_cast<float>(p[static_cast<size_t>(e)] * (dp[static_cast<size_t>(e)] - mix)));
          }
        }
      };
    }
    case Op::MoeRouterStats: {
      const graph::ValueId experts = in[1], mask = in[2];
      const int64_t K = cx->nd(experts).shape[1];
      return [cx, id, logits, experts, mask, lt, od, N, E, K] {
        const auto* ex = static_cast<const int32_t*>(cx->p(experts));
        check_experts(ex, N * K, E);
        const auto* m = mask != kNone ? static_cast<const int32_t*>(cx->p(mask)) : nullptr;
        // Per-thread sums over fixed row ranges, added in thread order: the same result for the same thread count.
        const int threads = omp_get_max_threads();
        std::vector<double> part(static_cast<size_t>(threads * (2 * E + 1)), 0.0);
#pragma omp parallel num_threads(threads)
        {
          const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
          double* s = part.data() + t * (2 * E + 1);
          std::vector<float> p(static_cast<size_t>(E));
          for (int64_t r = N * t / nt; r < N * (t + 1) / nt; ++r) {
            if (m != nullptr && m[r] == 0) continue;
            softmax_row(cx->p(logits), lt, r, E, p.data());
            for (int64_t k = 0; k < K; ++k) s[ex[r * K + k]] += 1;
            for (int64_t e = 0; e < E; ++e) s[E + e] += p[static_cast<size_t>(e)];
            s[2 * E] += 1;
          }
        }
        for (int64_t i = 0; i < 2 * E + 1; ++i) {
          double v = 0;
          for (int t = 0; t < threads; ++t) v += part[static_cast<size_t>(t * (2 * E + 1) + i)];
          st(cx->p(id), od, i, static_cast<float>(v));
        }
      };
    }
    case Op::MoeRouterStatsBackward: {
      const graph::ValueId mask = in[1], ds = in[2];
      const DType gd = cx->nd(ds).dtype;
      return [cx, id, logits, mask, ds, lt, gd, od, N, E] {
        const auto* m = mask != kNone ? static_cast<const int32_t*>(cx->p(mask)) : nullptr;
#pragma omp parallel
        {
          std::vector<float> p(static_cast<size_t>(E));
#pragma omp for schedule(static)
          for (int64_t r = 0; r < N; ++r) {
            if (m != nullptr && m[r] == 0) {
              for (int64_t e = 0; e < E; ++e) st(cx->p(id), od, r * E + e, 0.0f);
              continue;
            }
            softmax_row(cx->p(logits), lt, r, E, p.data());
            double mix = 0;
            for (int64_t e = 0; e < E; ++e) mix += static_cast<double>(ld(cx->p(ds), gd, E + e)) * p[static_cast<size_t>(e)];
            for (int64_t e = 0; e < E; ++e)
              st(cx->p(id), od, r * E + e, static_cast<float>(p[static_cast<size_t>(e)] * (ld(cx->p(ds), gd, E + e) - mix)));
          }
        }
      };
    }
    default: fail("internal: {} is not a router op", graph::op_name(op));
  }
}

// ---- rows of the experts' activations ----

// acc[c] += rnd(row[c]·w) for the row of `count` elements at element `at` of p (dt): typed loops the compiler
// vectorises for f32 and bf16.
void add_weighted_row(const void* p, DType dt, int64_t at, int64_t count, float w, float* acc) {
  if (dt == DType::F32) {
    const float* x = static_cast<const float*>(p) + at;
    for (int64_t c = 0; c < count; ++c) acc[c] += x[c] * w;
  } else if (dt == DType::BF16) {
    const uint16_t* x = static_cast<const uint16_t*>(p) + at;
    for (int64_t c = 0; c < count; ++c) acc[c] += round_bf16(bf16_to_f32(x[c]) * w);
  } else {
    for (int64_t c = 0; c < count; ++c) acc[c] += rnd(dt, ld(p, dt, at + c) * w);
  }
}

// out[at + c] = v[c] in dt.
void store_row(const float* v, int64_t count, void* out, DType dt, int64_t at) {
  if (dt == DType::F32) {
    std::memcpy(static_cast<float*>(out) + at, v, static_cast<size_t>(count) * sizeof(float));
  } else if (dt == DType::BF16) {
    uint16_t* o = static_cast<uint16_t*>(out) + at;
    for (int64_t c = 0; c < count; ++c) o[c] = f32_to_bf16(v[c]);
  } else {
    for (int64_t c = 0; c < count; ++c) st(out, dt, at + c, v[c]);
  }
}

// ---- GEMMs over a number of rows (or a depth) known at run time ----

// The rows (or depth) of the primitives: an expert's rows, padded to 16s, are whole chunks of 128 and at most one
// smaller chunk, so that a weight gradient is written in one pass per 128 rows.
constexpr int64_t kChunks[] = {128, 112, 96, 80, 64, 48, 32, 16};
constexpr int64_t kSmallRows = 8;  // an expert of at most this many rows takes dot products (decoding); more are padded to 16s

// out[m, N] (tc) = a[m, K] (row-major, ta) · B, B(k, n) at b[k·sb_k + n·sb_n] (tb), for m rows given at run time.
struct RowsGemm {
  int64_t N = 0, K = 0, sb_k = 0, sb_n = 0;
  DType ta = DType::F32, tb = DType::F32, tc = DType::F32;
  std::vector<std::unique_ptr<Gemm>> chunk;  // one per kChunks entry

  RowsGemm(int64_t n, int64_t k, DType a, DType b, int64_t bk, int64_t bn, DType c) : N(n), K(k), sb_k(bk), sb_n(bn), ta(a), tb(b), tc(c) {
    for (int64_t rows : kChunks) chunk.push_back(std::make_unique<Gemm>(rows, N, K, ta, K, 1, tb, sb_k, sb_n, tc, false, false));
  }

  // `parallel`: the caller is not inside a parallel region (the small rows split the columns across the threads).
  void run(const void* a, int64_t m, const void* b, void* c, bool parallel, std::vector<float>& xf) const {
    const size_t ea = dtype_size(ta), ec = dtype_size(tc);
    if (m <= kSmallRows) return small(a, m, b, c, parallel, xf);
    if (m % 16 != 0) fail("internal: moe_experts: {} rows of an expert, not a multiple of 16", m);
    int64_t r = 0;
    for (size_t i = 0; i < chunk.size(); ++i)
      for (; m - r >= kChunks[i]; r += kChunks[i])
        chunk[i]->run(static_cast<const char*>(a) + r * K * ea, b, static_cast<char*>(c) + r * N * ec);
  }

 private:
  // At most 8 rows (decoding): each column n of B read once for all of them. bf16 rows against bf16 nn.Linear rows
  // take the decoding GEMV's AVX512-BF16 kernel where the CPU has it (as the dense layers' GEMVs do); otherwise the
  // rows are widened to f32 once.
  void small(const void* a, int64_t m, const void* b, void* c, bool parallel, std::vector<float>& xf) const {
#if defined(__x86_64__)
    if (vec::dots_bf16bf16_available() && ta == DType::BF16 && tb == DType::BF16 && sb_k == 1) {
      const auto* x16 = static_cast<const uint16_t*>(a);
      constexpr int64_t kBlock = 64;  // weight rows whose results are stored together (as the dense GEMV does)
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
        const int64_t nn = std::min(kBlock, N - n0);
        float dots[kBlock * kSmallRows];  // [row of w][row of x]
        for (int64_t r = 0; r < nn; ++r) vec::dots_bf16bf16(x16, m, K, static_cast<const uint16_t*>(b) + (n0 + r) * sb_n, dots + r * m);
        for (int64_t j = 0; j < m; ++j)
          for (int64_t r = 0; r < nn; ++r) st(c, tc, j * N + n0 + r, dots[r * m + j]);
      }
      return;
    }
#endif
    xf.resize(static_cast<size_t>(m * K));
    for (int64_t i = 0; i < m * K; ++i) xf[static_cast<size_t>(i)] = ld(a, ta, i);
    const float* x = xf.data();
    if (sb_k == 1) {  // B's columns are contiguous rows of w (nn.Linear layout): dot products
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t n = 0; n < N; ++n) {
        float dots[8];
        for (int64_t m0 = 0; m0 < m; m0 += 8) {
          const int64_t mm = std::min<int64_t>(8, m - m0);
          if (tb == DType::BF16) {
            vec::dots_bf16(x + m0 * K, mm, K, static_cast<const uint16_t*>(b) + n * sb_n, dots);
          } else if (tb == DType::F32) {
            for (int64_t j = 0; j < mm; ++j) dots[j] = vec::dot(x + (m0 + j) * K, static_cast<const float*>(b) + n * sb_n, K);
          } else {
            for (int64_t j = 0; j < mm; ++j) {
              double s = 0;
              for (int64_t k = 0; k < K; ++k) s += static_cast<double>(x[(m0 + j) * K + k]) * ld(b, tb, n * sb_n + k);
              dots[j] = static_cast<float>(s);
            }
          }
          for (int64_t j = 0; j < mm; ++j) st(c, tc, (m0 + j) * N + n, dots[j]);
        }
      }
      return;
    }
    // B's rows are contiguous (sb_n == 1): out[j, :] = Σ_k x[j, k]·B[k, :], in column blocks across the threads.
    constexpr int64_t kBlock = 256;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
      const int64_t nn = std::min(kBlock, N - n0);
      float acc[kBlock];
      for (int64_t j = 0; j < m; ++j) {
        std::fill(acc, acc + nn, 0.0f);
        for (int64_t k = 0; k < K; ++k) {
          const float xv = x[j * K + k];
          if (xv == 0.0f) continue;
          if (tb == DType::BF16) {
            vec::axpy_bf16(acc, xv, static_cast<const uint16_t*>(b) + k * sb_k + n0, nn);
          } else {
            for (int64_t i = 0; i < nn; ++i) acc[i] += xv * ld(b, tb, k * sb_k + n0 + i);
          }
        }
        for (int64_t i = 0; i < nn; ++i) st(c, tc, j * N + n0 + i, acc[i]);
      }
    }
  }
};

// c[M, N] (f32) += pᵀ·q with p [depth, M], q [depth, N] row-major (ta), for a depth given at run time: an expert's
// weight gradient summed over its rows.
struct DepthGemm {
  int64_t M = 0, N = 0;
  DType ta = DType::F32;
  std::vector<std::unique_ptr<Gemm>> write, add;  // per kChunks entry: c = pᵀ·q (the first chunk), c += pᵀ·q

  DepthGemm(int64_t m, int64_t n, DType a) : M(m), N(n), ta(a) {
    for (int64_t depth : kChunks) {
      write.push_back(std::make_unique<Gemm>(M, N, depth, ta, 1, M, ta, N, 1, DType::F32, false, false));
      add.push_back(std::make_unique<Gemm>(M, N, depth, ta, 1, M, ta, N, 1, DType::F32, false, true));
    }
  }

  // c = pᵀ·q over `depth` rows, a multiple of 16 (the routing pads every expert of a backward pass): c is written
  // by the first chunk (no need to clear it) and added to by the others.
  void run(const void* p, const void* q, int64_t depth, float* c) const {
    if (depth % 16 != 0 || depth == 0) fail("internal: moe_experts_backward: a depth of {}, not a positive multiple of 16", depth);
    const size_t ea = dtype_size(ta);
    int64_t r = 0;
    for (size_t i = 0; i < write.size(); ++i)
      for (; depth - r >= kChunks[i]; r += kChunks[i])
        (r == 0 ? write : add)[i]->run(static_cast<const char*>(p) + r * M * ea, static_cast<const char*>(q) + r * N * ea, c);
  }
};

// ---- the routing of one run: the (token, choice) slots grouped by expert ----

struct Routing {
  std::vector<int64_t> start;  // [E + 1]: expert e's rows are [start[e], start[e + 1]) of the sorted order
  std::vector<int64_t> count;  // [E]: its (token, choice) slots; the rows past them up to start[e + 1] are padding
  std::vector<int32_t> token;  // [rows]: the token of each sorted row (-1: padding)
  std::vector<int32_t> pos;    // [N·K]: the row slot (n, k) went to (-1: another rank's expert, expert parallel)
  std::vector<int32_t> busy;   // the experts with at least one slot, most slots first
  std::vector<int32_t> local;  // [N·K]: the local expert of each slot (-1: another rank's)

  // `pad`: an expert of more than 8 slots (or any, with pad_all) gets its rows padded to a multiple of 16, so
  // that its GEMMs are whole 16-row chunks (zero rows add nothing to a weight gradient); at most 8 take the dot
  // products exactly (decoding).
  // Expert parallel: the E experts here are [first, first + E) of `total` (0: E) numbered globally in `experts`.
  void build(const int32_t* experts, int64_t N, int64_t K, int64_t E, bool pad_all, int64_t first = 0, int64_t total = 0) {
    count.assign(static_cast<size_t>(E), 0);
    local.resize(static_cast<size_t>(N * K));
    for (int64_t i = 0; i < N * K; ++i) {
      const int64_t e = checked_expert(experts, i, total > 0 ? total : E) - first;
      local[static_cast<size_t>(i)] = e >= 0 && e < E ? static_cast<int32_t>(e) : -1;
      if (e >= 0 && e < E) ++count[static_cast<size_t>(e)];
    }
    start.assign(static_cast<size_t>(E + 1), 0);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t c = count[static_cast<size_t>(e)];
      start[static_cast<size_t>(e + 1)] = start[static_cast<size_t>(e)] + (c > 0 && (pad_all || c > kSmallRows) ? (c + 15) / 16 * 16 : c);
    }
    token.assign(static_cast<size_t>(start[static_cast<size_t>(E)]), -1);
    pos.resize(static_cast<size_t>(N * K));
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < N * K; ++i) {
      const int32_t e = local[static_cast<size_t>(i)];
      if (e < 0) {
        pos[static_cast<size_t>(i)] = -1;
        continue;
      }
      const int64_t at = next[static_cast<size_t>(e)]++;
      token[static_cast<size_t>(at)] = static_cast<int32_t>(i / K);
      pos[static_cast<size_t>(i)] = static_cast<int32_t>(at);
    }
    busy.clear();
    for (int64_t e = 0; e < E; ++e)
      if (count[static_cast<size_t>(e)] > 0) busy.push_back(static_cast<int32_t>(e));
    std::stable_sort(busy.begin(), busy.end(), [&](int32_t a, int32_t b) { return rows(a) > rows(b); });
  }
  int64_t rows(int32_t e) const { return start[static_cast<size_t>(e) + 1] - start[static_cast<size_t>(e)]; }  // padding included
  int64_t first(int32_t e) const { return start[static_cast<size_t>(e)]; }
  // The most rows an (N·K)-slot routing over E experts can take.
  static int64_t max_rows(int64_t slots, int64_t E) { return slots + 15 * std::min(slots, E); }
};

// Runs fn(e, parallel_inside) for every busy expert: in parallel across experts when there are enough of them to
// keep the threads busy, else one after the other with the threads inside each expert's work.
template <typename Fn>
void for_each_expert(const Routing& r, Fn fn) {
  const int threads = omp_get_max_threads();
  const auto busy = static_cast<int64_t>(r.busy.size());
  // Experts of a few rows (decoding) are memory-bound dot products: the threads share each expert's weight rows,
  // as the dense GEMV does (measured faster than one expert per thread).
  const bool small = !r.busy.empty() && r.rows(r.busy.front()) <= kSmallRows;
  if (threads > 1 && busy >= 2 * threads && !small) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < busy; ++i) fn(r.busy[static_cast<size_t>(i)], false);
  } else {
    for (int32_t e : r.busy) fn(e, true);
  }
}

// The shapes of one moe_experts node and its working memory (transient, while the kernel runs).
struct ExpertsShape {
  int64_t N = 0, C = 0, K = 0, E = 0, F = 0;
  DType dt = DType::F32, wt = DType::F32;  // x and the experts' weights; the routing weights
  size_t es = 4;                           // bytes per dt element
  int64_t slots() const { return N * K; }
};

ExpertsShape experts_shape(ProgramContext* cx, const Node& n) {
  ExpertsShape s;
  s.N = cx->nd(n.inputs[0]).shape[0];
  s.C = cx->nd(n.inputs[0]).shape[1];
  s.K = cx->nd(n.inputs[1]).shape[1];
  s.E = cx->nd(n.inputs[3]).shape[0];
  s.F = cx->nd(n.inputs[3]).shape[1] / 2;
  s.dt = cx->nd(n.inputs[0]).dtype;
  s.wt = cx->nd(n.inputs[2]).dtype;
  s.es = dtype_size(s.dt);
  return s;
}

// The forward of every busy expert on its gathered rows: X [slots, C], H [slots, 2F], A [slots, F], O [slots, C]
// (all in dt, rows in the sorted order).
struct ExpertsForward {
  ExpertsShape s;
  RowsGemm up, down;  // H = X·gate_upᵀ; O = A·downᵀ
  ExpertsForward(const ExpertsShape& shape)
      : s(shape), up(2 * s.F, s.C, s.dt, s.dt, 1, s.C, s.dt), down(s.C, s.F, s.dt, s.dt, 1, s.F, s.dt) {}

  // A from H for rows [0, m): silu(gate) rounded to dt, times up, rounded (Transformers' rounding points; the
  // dense swiglu op's kernel for bf16).
  void activate(const char* h, int64_t m, char* a, bool parallel) const {
    const int64_t F = s.F;
    if (s.dt == DType::BF16 && vec::swiglu_bf16_available()) {
      const auto* h16 = reinterpret_cast<const uint16_t*>(h);
      auto* a16 = reinterpret_cast<uint16_t*>(a);
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t r = 0; r < m; ++r) vec::swiglu_bf16(h16 + r * 2 * F, h16 + r * 2 * F + F, F, a16 + r * F);
      return;
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t f = 0; f < F; ++f) {
        const float g = ld(h, s.dt, r * 2 * F + f), u = ld(h, s.dt, r * 2 * F + F + f);
        st(a, s.dt, r * F + f, rnd(s.dt, g / (1.0f + std::exp(-g))) * u);
      }
  }

  // Expert e's rows: gather x, then H, A, O.
  void run_expert(int32_t e, const Routing& rt, const void* x, const char* gate_up, const char* down_w, char* X, char* H, char* A, char* O,
                  bool parallel, std::vector<float>& xf) const {
    const int64_t m = rt.rows(e), r0 = rt.first(e), C = s.C, F = s.F;
    for (int64_t r = 0; r < m; ++r) {
      const int32_t tok = rt.token[static_cast<size_t>(r0 + r)];
      char* row = X + (r0 + r) * C * s.es;
      if (tok < 0) std::memset(row, 0, static_cast<size_t>(C) * s.es);  // padding: zero rows, zero results
      else std::memcpy(row, static_cast<const char*>(x) + tok * C * s.es, static_cast<size_t>(C) * s.es);
    }
    up.run(X + r0 * C * s.es, m, gate_up + e * 2 * F * C * s.es, H + r0 * 2 * F * s.es, parallel, xf);
    activate(H + r0 * 2 * F * s.es, m, A + r0 * F * s.es, parallel);
    down.run(A + r0 * F * s.es, m, down_w + e * C * F * s.es, O + r0 * C * s.es, parallel, xf);
  }
};

// Transient layout: X, H, A, O in dt, then what the backward adds.
struct Layout {
  size_t X = 0, H = 0, A = 0, O = 0, dO = 0, dA = 0, dH = 0, dX = 0, end = 0;
  Layout(const ExpertsShape& s, bool backward) {
    const size_t n = static_cast<size_t>(Routing::max_rows(s.slots(), s.E)), C = static_cast<size_t>(s.C), F = static_cast<size_t>(s.F);
    auto take = [&](size_t bytes) {
      const size_t at = end;
      end += (bytes + 63) / 64 * 64;
      return at;
    };
    X = take(n * C * s.es);
    H = take(n * 2 * F * s.es);
    A = take(n * F * s.es);
    O = take(n * C * s.es);
    if (!backward) return;
    dO = take(n * C * s.es);
    dA = take(n * F * sizeof(float));
    dH = take(n * 2 * F * s.es);
    dX = take(n * C * sizeof(float));
  }
};

}  // namespace

Kernel lower_moe_router(ProgramContext* cx, graph::ValueId id) { return router_kernel(cx, id); }

Kernel lower_moe_experts(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const std::vector<graph::ValueId> in = n.inputs;  // x, experts, weights, gate_up, down
  auto fw = std::make_shared<ExpertsForward>(experts_shape(cx, n));
  const Layout lay(fw->s, false);
  cx->reserve_transient(lay.end);
  auto rt = std::make_shared<Routing>();
  const int64_t first = n.attrs.offset, total = n.attrs.rows;
  return [cx, id, in, fw, lay, rt, first, total] {
    const ExpertsShape& s = fw->s;
    rt->build(static_cast<const int32_t*>(cx->p(in[1])), s.N, s.K, s.E, /*pad_all=*/false, first, total);
    char* t = cx->transient();
    const auto* gu = static_cast<const char*>(cx->p(in[3]));
    const auto* dn = static_cast<const char*>(cx->p(in[4]));
    for_each_expert(*rt, [&](int32_t e, bool parallel) {
      thread_local std::vector<float> xf;
      fw->run_expert(e, *rt, cx->p(in[0]), gu, dn, t + lay.X, t + lay.H, t + lay.A, t + lay.O, parallel, xf);
    });
    // y[n] = Σ_k rnd(O[pos(n, k)]·rnd(w[n, k])), rounded once.
    const char* O = t + lay.O;
    const void* w = cx->p(in[2]);
#pragma omp parallel
    {
      std::vector<float> acc(static_cast<size_t>(s.C));
#pragma omp for schedule(static)
      for (int64_t tok = 0; tok < s.N; ++tok) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t k = 0; k < s.K; ++k) {
          const int64_t row = rt->pos[static_cast<size_t>(tok * s.K + k)];
          if (row < 0) continue;  // another rank's expert
          const float wk = rnd(s.dt, ld(w, s.wt, tok * s.K + k));
          add_weighted_row(O, s.dt, row * s.C, s.C, wk, acc.data());
        }
        store_row(acc.data(), s.C, cx->p(id), s.dt, tok * s.C);
      }
    }
  };
}

Kernel lower_moe_experts_backward(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const std::vector<graph::ValueId> in = n.inputs;  // x, experts, weights, gate_up, down, dy
  const bool dh_only = n.attrs.dh_only;
  const DType od = n.dtype, gd = cx->nd(in[5]).dtype;
  auto fw = std::make_shared<ExpertsForward>(experts_shape(cx, n));
  const ExpertsShape& s = fw->s;
  // dA = dO·down_e [m, F] (f32); dX = dH·gate_up_e [m, C] (f32); dgate_up_e += dHᵀ·X; ddown_e += dOᵀ·A.
  auto back_a = std::make_shared<RowsGemm>(s.F, s.C, s.dt, s.dt, s.F, 1, DType::F32);
  auto back_x = std::make_shared<RowsGemm>(s.C, 2 * s.F, s.dt, s.dt, s.C, 1, DType::F32);
  auto grad_gu = dh_only ? nullptr : std::make_shared<DepthGemm>(2 * s.F, s.C, s.dt);
  auto grad_dn = dh_only ? nullptr : std::make_shared<DepthGemm>(s.C, s.F, s.dt);
  const Layout lay(s, true);
  // The weight gradients in f32 straight into the result, or into transient memory when the result is not f32.
  const size_t ngu = static_cast<size_t>(s.E * 2 * s.F * s.C), ndn = static_cast<size_t>(s.E * s.C * s.F);
  const bool direct = od == DType::F32;
  const size_t grads_at = lay.end;
  cx->reserve_transient(lay.end + (dh_only || direct ? 0 : (ngu + ndn) * sizeof(float)));
  auto rt = std::make_shared<Routing>();
  const int64_t first = n.attrs.offset, total = n.attrs.rows;
  return [cx, id, in, dh_only, od, gd, fw, back_a, back_x, grad_gu, grad_dn, lay, ngu, ndn, direct, grads_at, rt, first, total] {
    const ExpertsShape& sh = fw->s;
    const int64_t C = sh.C, F = sh.F, NK = sh.slots();
    rt->build(static_cast<const int32_t*>(cx->p(in[1])), sh.N, sh.K, sh.E, /*pad_all=*/true, first, total);
    char* t = cx->transient();
    char *X = t + lay.X, *H = t + lay.H, *A = t + lay.A, *O = t + lay.O, *dO = t + lay.dO, *dH = t + lay.dH;
    auto* dA = reinterpret_cast<float*>(t + lay.dA);
    auto* dX = reinterpret_cast<float*>(t + lay.dX);
    const auto* gu = static_cast<const char*>(cx->p(in[3]));
    const auto* dn = static_cast<const char*>(cx->p(in[4]));
    const void* w = cx->p(in[2]);
    const void* dy = cx->p(in[5]);
    void* out = cx->p(id);
    const int64_t nx = sh.N * C, nw = NK;
    float* dgu = dh_only ? nullptr : direct ? static_cast<float*>(out) + nx + nw : reinterpret_cast<float*>(t + grads_at);
    float* ddn = dh_only ? nullptr : dgu + ngu;
    for (int64_t slot = 0; slot < NK; ++slot)  // a choice of another rank's expert: a zero dweight here
      if (rt->pos[static_cast<size_t>(slot)] < 0) st(out, od, nx + slot, 0.0f);
    if (!dh_only)  // an expert no token chose: a zero gradient (the others' are written whole by their GEMMs)
      for (int64_t e = 0; e < sh.E; ++e)
        if (rt->count[static_cast<size_t>(e)] == 0) {
          std::memset(dgu + e * 2 * F * C, 0, static_cast<size_t>(2 * F * C) * sizeof(float));
          std::memset(ddn + e * C * F, 0, static_cast<size_t>(C * F) * sizeof(float));
        }
    for_each_expert(*rt, [&](int32_t e, bool parallel) {
      thread_local std::vector<float> xf;
      fw->run_expert(e, *rt, cx->p(in[0]), gu, dn, X, H, A, O, parallel, xf);
      const int64_t m = rt->rows(e), r0 = rt->first(e);
      // dO = w·dy (rounded to dt: the GEMMs' operand, as autocast rounds a bf16 layer's gradient) and dweights.
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t r = r0; r < r0 + m; ++r) {
        const int64_t tok = rt->token[static_cast<size_t>(r)];
        if (tok < 0) {  // padding: a zero gradient row, so that it adds nothing to the weight gradients
          std::memset(dO + r * C * sh.es, 0, static_cast<size_t>(C) * sh.es);
          continue;
        }
        int64_t slot = tok * sh.K;
        while (rt->pos[static_cast<size_t>(slot)] != r) ++slot;
        const float wk = rnd(sh.dt, ld(w, sh.wt, slot));
        float dot = 0;
        if (gd == DType::F32 && sh.dt == DType::BF16) {  // bf16 training: typed loops
          const float* g = static_cast<const float*>(dy) + tok * C;
          const uint16_t* o = reinterpret_cast<const uint16_t*>(O) + r * C;
          uint16_t* d = reinterpret_cast<uint16_t*>(dO) + r * C;
          for (int64_t c = 0; c < C; ++c) {
            dot += g[c] * bf16_to_f32(o[c]);
            d[c] = f32_to_bf16(g[c] * wk);
          }
        } else {
          for (int64_t c = 0; c < C; ++c) {
            const float g = ld(dy, gd, tok * C + c);
            dot += g * ld(O, sh.dt, r * C + c);
            st(dO, sh.dt, r * C + c, g * wk);
          }
        }
        st(out, od, nx + slot, dot);
      }
      back_a->run(dO + r0 * C * sh.es, m, dn + e * C * F * sh.es, dA + r0 * F, parallel, xf);
      // dH: dgate = dA·up·silu'(gate), dup = dA·silu(gate).
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t r = r0; r < r0 + m; ++r) {
        if (sh.dt == DType::BF16) {
          const uint16_t* h = reinterpret_cast<const uint16_t*>(H) + r * 2 * F;
          uint16_t* d = reinterpret_cast<uint16_t*>(dH) + r * 2 * F;
          const float* da = dA + r * F;
          for (int64_t f = 0; f < F; ++f) {
            const float g = bf16_to_f32(h[f]), u = bf16_to_f32(h[F + f]);
            const float sig = 1.0f / (1.0f + std::exp(-g));
            d[f] = f32_to_bf16(da[f] * u * sig * (1.0f + g * (1.0f - sig)));
            d[F + f] = f32_to_bf16(da[f] * g * sig);
          }
          continue;
        }
        for (int64_t f = 0; f < F; ++f) {
          const float g = ld(H, sh.dt, r * 2 * F + f), u = ld(H, sh.dt, r * 2 * F + F + f), da = dA[r * F + f];
          const float sig = 1.0f / (1.0f + std::exp(-g));
          st(dH, sh.dt, r * 2 * F + f, da * u * sig * (1.0f + g * (1.0f - sig)));
          st(dH, sh.dt, r * 2 * F + F + f, da * g * sig);
        }
      }
      back_x->run(dH + r0 * 2 * F * sh.es, m, gu + e * 2 * F * C * sh.es, dX + r0 * C, parallel, xf);
      if (!dh_only) {
        grad_gu->run(dH + r0 * 2 * F * sh.es, X + r0 * C * sh.es, m, dgu + e * 2 * F * C);
        grad_dn->run(dO + r0 * C * sh.es, A + r0 * F * sh.es, m, ddn + e * C * F);
      }
    });
    // dx[n] = Σ_k dX[pos(n, k)].
#pragma omp parallel
    {
      std::vector<float> v(static_cast<size_t>(C));
#pragma omp for schedule(static)
      for (int64_t tok = 0; tok < sh.N; ++tok) {
        std::fill(v.begin(), v.end(), 0.0f);
        for (int64_t k = 0; k < sh.K; ++k) {
          const int64_t at = rt->pos[static_cast<size_t>(tok * sh.K + k)];
          if (at < 0) continue;  // another rank's expert
          const float* row = dX + at * C;
          for (int64_t c = 0; c < C; ++c) v[static_cast<size_t>(c)] += row[c];
        }
        store_row(v.data(), C, out, od, tok * C);
      }
    }
    if (!dh_only && !direct)
      for (size_t i = 0; i < ngu + ndn; ++i) st(out, od, nx + nw + static_cast<int64_t>(i), dgu[i]);
  };
}

}  // namespace trl::cpu

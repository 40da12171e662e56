// The lm_head GEMMs of the vocabulary ops (ops_vocab.cpp) and the distillation ops (ops_distill.cpp): a head
// h:[R,C] (leading dims flattened) times w:[V,C]ᵀ, formed [R, 4096] columns at a time into the arena's scratch, never
// [R, V]. Mixed dtypes (h and w differ) widen both to f32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/lower.h"
#include "backend/cpu/vec.h"
#include "backend/vocab_parallel.h"
#include "trl/core/error.h"

namespace trl::cpu {

using graph::ValueId;

constexpr int64_t kVocabChunk = 4096;  // logits are formed [rows, 4096] at a time

// One vocabulary op's shapes and the GEMMs that form its logits chunk by chunk.
struct LogitsHead {
  int64_t R = 0, C = 0, V = 0, chunk = 0;
  DType dh = DType::F32, dw = DType::F32;
  DType hw = DType::F32;              // the GEMMs' input type: f32 when h and w differ (both are widened)
  std::shared_ptr<Gemm> full, last;   // logits chunk [R, c] = h[R,C]·w[j0:j0+c, C]ᵀ; last: the shorter tail chunk
  size_t logits_at = 0;               // scratch: the [R, chunk] f32 logits
  std::shared_ptr<std::vector<float>> hbuf, wbuf;  // h and one w chunk widened to f32 (mixed dtypes only)
  graph::VocabSplit split;                         // vocabulary parallel: w is rows [offset, offset + V) of split.size
  const char* what = "";

  const char* w_chunk(const ProgramContext* cx, ValueId w, int64_t j0, int64_t c) const {
    const char* wp = static_cast<const char*>(cx->p(w)) + j0 * C * static_cast<int64_t>(dtype_size(dw));
    if (wbuf->empty()) return wp;
    for (int64_t i = 0; i < c * C; ++i) (*wbuf)[static_cast<size_t>(i)] = ld(wp, dw, i);
    return reinterpret_cast<const char*>(wbuf->data());
  }
  // h in the GEMM type (widened once per run for mixed dtypes).
  const char* h_input(const ProgramContext* cx, ValueId h) const {
    const char* hp = static_cast<const char*>(cx->p(h));
    if (hbuf->empty()) return hp;
    for (int64_t i = 0; i < R * C; ++i) (*hbuf)[static_cast<size_t>(i)] = ld(hp, dh, i);
    return reinterpret_cast<const char*>(hbuf->data());
  }
  // The logits of columns [j0, j0 + c) into lg [R, c]; returns the w chunk the GEMM read.
  const char* logits(const ProgramContext* cx, const char* hp, ValueId w, int64_t j0, int64_t c, float* lg) const {
    const char* wp = w_chunk(cx, w, j0, c);
    (c == chunk ? full : last)->run(hp, wp, lg);
    return wp;
  }
  // A row of logits rounded to the model dtype (Transformers stores a bf16 model's logits in bf16 before the f32
  // loss); called in the kernels' row loops, so the chunk is not read once more.
  void round_row(float* z, int64_t c) const {
    if (dh == DType::BF16) vec::round_to_bf16(z, c);
    else if (dh != DType::F32)
      for (int64_t j = 0; j < c; ++j) z[j] = rnd(dh, z[j]);
  }
  void check_targets(const int32_t* t) const {
    const int64_t whole = whole_vocab(split, V);
    if (t)
      for (int64_t r = 0; r < R; ++r)
        if (t[r] < 0 || t[r] >= whole) fail("{}: target {} at row {} is outside the vocabulary [0, {})", what, t[r], r, whole);
  }
  // The targets as rows of w (themselves without a split; outside [0, V) where another rank holds them), in buf.
  const int32_t* local_targets(const int32_t* t, std::vector<int32_t>& buf) const {
    if (!t || !split.split()) return t;
    buf.resize(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) buf[static_cast<size_t>(r)] = local_target(split, t[r]);
    return buf.data();
  }
};

inline LogitsHead make_head(ProgramContext* cx, const Node& n, ValueId h, ValueId w) {
  LogitsHead hd;
  hd.what = graph::op_name(n.op);
  hd.C = cx->nd(h).shape.back();
  hd.R = shape_numel(cx->nd(h).shape) / hd.C;
  hd.V = cx->nd(w).shape[0];
  hd.chunk = std::min(kVocabChunk, hd.V);
  hd.dh = cx->nd(h).dtype;
  hd.dw = cx->nd(w).dtype;
  hd.hw = hd.dh == hd.dw ? hd.dh : DType::F32;
  hd.split = n.attrs.vocab;
  hd.full = std::make_shared<Gemm>(hd.R, hd.chunk, hd.C, hd.hw, hd.C, 1, hd.hw, 1, hd.C, DType::F32, false, false);
  if (const int64_t tail = hd.V % hd.chunk)
    hd.last = std::make_shared<Gemm>(hd.R, tail, hd.C, hd.hw, hd.C, 1, hd.hw, 1, hd.C, DType::F32, false, false);
  // In the arena's scratch, not on the heap: a trainer caching a program per length holds one copy of it.
  hd.logits_at = cx->reserve_scratch(static_cast<size_t>(hd.R * hd.chunk) * sizeof(float));
  const bool mixed = hd.dh != hd.dw;
  hd.hbuf = std::make_shared<std::vector<float>>(mixed ? static_cast<size_t>(hd.R * hd.C) : 0);
  hd.wbuf = std::make_shared<std::vector<float>>(mixed ? static_cast<size_t>(hd.chunk * hd.C) : 0);
  return hd;
}

// The backward's two GEMMs per chunk on dz [R, c] (bf16 for a bf16 head, else f32; dz16_at: scratch for the bf16 dz):
// dh[R,C] += dz·w_chunk[c,C] and dw_chunk[c,C] = dzᵀ·h[R,C], into the packed f32 [dh | dw] (dw skipped for a
// frozen head).
struct HeadGradGemms {
  std::shared_ptr<Gemm> dh_full, dw_full, dh_last, dw_last;  // last: the shorter tail chunk
  int64_t R = 0, C = 0, chunk = 0;
  bool to16 = false;
  size_t dz16_at = 0;
  void run(const void* dz, const char* wp, const char* hp, float* out, int64_t j0, int64_t c, bool dh_only) const {
    (c == chunk ? dh_full : dh_last)->run(dz, wp, out);
    if (!dh_only) (c == chunk ? dw_full : dw_last)->run(dz, hp, out + R * C + j0 * C);
  }
};

inline HeadGradGemms make_grad_gemms(ProgramContext* cx, const LogitsHead& hd) {
  HeadGradGemms g;
  g.R = hd.R, g.C = hd.C, g.chunk = hd.chunk, g.to16 = hd.hw == DType::BF16;
  const int64_t R = hd.R, C = hd.C, chunk = hd.chunk, tail = hd.V % chunk;
  const DType hw = hd.hw;
  g.dz16_at = g.to16 ? cx->reserve_scratch(static_cast<size_t>(R * chunk) * sizeof(uint16_t)) : 0;
  g.dh_full = std::make_shared<Gemm>(R, C, chunk, hw, chunk, 1, hw, C, 1, DType::F32, false, true);
  g.dw_full = std::make_shared<Gemm>(chunk, C, R, hw, 1, chunk, hw, C, 1, DType::F32, false, false);
  if (tail) {
    g.dh_last = std::make_shared<Gemm>(R, C, tail, hw, tail, 1, hw, C, 1, DType::F32, false, true);
    g.dw_last = std::make_shared<Gemm>(tail, C, R, hw, 1, tail, hw, C, 1, DType::F32, false, false);
  }
  return g;
}

}  // namespace trl::cpu

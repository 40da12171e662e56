// Data movement on the CPU: embedding lookup and its scatter-add backward, cast, fill, slice, the KV cache write.
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

// ids:[B,T] i32, table:[V,C] -> [B,T,C]; an id outside [0, V) is an error naming its position
Kernel lower_embedding(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId ids = n.inputs[0], table = n.inputs[1];
  const int64_t C = cx->nd(table).shape[1], V = cx->nd(table).shape[0], rows = shape_numel(cx->nd(ids).shape);
  const DType td = cx->nd(table).dtype;
  // Vocabulary parallel: the table is rows [offset, offset + V) of the vocabulary; the ids of other ranks' rows
  // give zeros (the graph sums the ranks' results).
  const graph::VocabSplit split = n.attrs.vocab;
  const int64_t whole = split.split() ? split.size : V, offset = split.split() ? split.offset : 0;
  return [cx, id, ids, table, C, V, rows, td, od, whole, offset] {
    const int32_t* x = static_cast<const int32_t*>(cx->p(ids));
    for (int64_t r = 0; r < rows; ++r)
      if (x[r] < 0 || x[r] >= whole) fail("embedding: token id {} at flat position {} is out of range for a vocabulary of {}", x[r], r, whole);
    dispatch(td, cx->p(table), od, cx->p(id), [&](auto tab, auto out) {
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = x[r] - offset;
        if (row < 0 || row >= V) {
          for (int64_t c = 0; c < C; ++c) out.st(r * C + c, 0.0f);
          continue;
        }
        for (int64_t c = 0; c < C; ++c) out.st(r * C + c, tab.ld(row * C + c));
      }
    });
  };
}

// ids:[B,T] i32, dy:[B,T,C], base:[V,C]|none -> base + scatter-add of dy rows at ids
Kernel lower_embedding_backward(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId ids = n.inputs[0], dy = n.inputs[1], base = n.inputs.size() > 2 ? n.inputs[2] : kNone;
  const int64_t C = cx->nd(dy).shape.back(), rows = shape_numel(cx->nd(ids).shape), V = n.attrs.rows;
  const DType dd = cx->nd(dy).dtype, db = base != kNone ? cx->nd(base).dtype : od;
  const int64_t offset = n.attrs.vocab.split() ? n.attrs.vocab.offset : 0;  // vocabulary parallel: only this rank's rows
  return [cx, id, ids, dy, base, C, rows, V, dd, db, od, offset] {
    const int64_t total = V * C;
    if (cx->inplace(id)) {
      // the output is the base's buffer: nothing to copy
    } else if (base == kNone) {
      std::memset(cx->p(id), 0, static_cast<size_t>(total) * dtype_size(od));
    } else if (db == od) {
      const char* src = static_cast<const char*>(cx->p(base));
      char* dst = static_cast<char*>(cx->p(id));
      const int64_t bytes = total * static_cast<int64_t>(dtype_size(od));
#pragma omp parallel for schedule(static)
      for (int64_t chunk = 0; chunk < bytes; chunk += 1 << 20) {
        std::memcpy(dst + chunk, src + chunk, static_cast<size_t>(std::min<int64_t>(1 << 20, bytes - chunk)));
      }
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < total; ++i) st(cx->p(id), od, i, ld(cx->p(base), db, i));
    }
    // Rows in order, columns contiguous: a token seen twice adds twice; a few hundred rows, no threads needed.
    const int32_t* x = static_cast<const int32_t*>(cx->p(ids));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = x[r] - offset;
      if (row < 0 || row >= V) continue;
      if (od == DType::F32 && dd == DType::F32) {
        float* o = static_cast<float*>(cx->p(id)) + row * C;
        const float* g = static_cast<const float*>(cx->p(dy)) + r * C;
        for (int64_t c = 0; c < C; ++c) o[c] += g[c];
      } else {
        for (int64_t c = 0; c < C; ++c) st(cx->p(id), od, row * C + c, ld(cx->p(id), od, row * C + c) + ld(cx->p(dy), dd, r * C + c));
      }
    }
  };
}

// x -> x in another dtype (f32 -> bf16 rounds to nearest even)
Kernel lower_cast(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const DType sd = cx->nd(n.inputs[0]).dtype;
  const int64_t count = shape_numel(n.shape);
  const graph::ValueId x = n.inputs[0];
  return [cx, id, x, sd, od, count] {
    const void* s = cx->p(x);
    void* d = cx->p(id);
    if (sd == DType::F32 && od == DType::BF16) {
      const float* a = static_cast<const float*>(s);
      uint16_t* b = static_cast<uint16_t*>(d);
      constexpr int64_t kBlock = 8192;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; i += kBlock) vec::to_bf16(a + i, std::min(kBlock, count - i), b + i);
      return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) st(d, od, i, ld(s, sd, i));
  };
}

// -> shape filled with attrs.value
Kernel lower_fill(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const int64_t count = shape_numel(n.shape);
  const float v = static_cast<float>(n.attrs.value);
  return [cx, id, od, count, v] {
    for (int64_t i = 0; i < count; ++i) st(cx->p(id), od, i, v);
  };
}

// x:[B,T,...] -> x[:, offset : offset + rows, ...]
Kernel lower_slice(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId x = n.inputs[0];
  const int64_t B = cx->nd(x).shape[0], T = cx->nd(x).shape[1], inner = shape_numel(cx->nd(x).shape) / (B * T);
  const int64_t es = static_cast<int64_t>(dtype_size(od)), start = n.attrs.offset, rows = n.attrs.rows;
  return [cx, id, x, B, T, inner, es, start, rows] {
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(static_cast<char*>(cx->p(id)) + b * rows * inner * es, static_cast<const char*>(cx->p(x)) + (b * T + start) * inner * es,
                  static_cast<size_t>(rows * inner * es));
  };
}

// cache:[Bc,S,Hkv,D], x:[B,T,Hkv,D], pos:[1] or [B] i32, optional rows:[B] i32 -> the cache with x's row b at slots
// [pos, pos + T) of cache row rows[b] (b without rows), written in place
Kernel lower_kv_cache_write(ProgramContext* cx, graph::ValueId id) {
  const Node& n = cx->nd(id);
  const DType od = n.dtype;
  const graph::ValueId x = n.inputs[1], pos = n.inputs[2], rows = n.inputs.size() > 3 ? n.inputs[3] : kNone;
  const int64_t Bc = n.shape[0], S = n.shape[1], row = n.shape[2] * n.shape[3], B = cx->nd(x).shape[0], T = cx->nd(x).shape[1];
  const bool per_row = cx->nd(pos).shape[0] == B && B > 1;
  const DType dx = cx->nd(x).dtype;
  const std::string name = n.name;
  return [cx, id, x, pos, rows, Bc, B, S, row, T, per_row, dx, od, name] {
    const int32_t* p = static_cast<const int32_t*>(cx->p(pos));
    const int32_t* r = rows != kNone ? static_cast<const int32_t*>(cx->p(rows)) : nullptr;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t p0 = p[per_row ? b : 0], cb = r ? r[b] : b;
      if (p0 < 0 || p0 + T > S) fail("kv_cache_write {}: rows [{}, {}) do not fit a cache of {} positions", name, p0, p0 + T, S);
      if (cb < 0 || cb >= Bc) fail("kv_cache_write {}: cache row {} (batch row {}) is outside the cache's {} rows", name, cb, b, Bc);
      if (dx == od) {
        const size_t es = dtype_size(od);
        std::memcpy(static_cast<char*>(cx->p(id)) + static_cast<size_t>((cb * S + p0) * row) * es,
                    static_cast<const char*>(cx->p(x)) + static_cast<size_t>(b * T * row) * es, static_cast<size_t>(T * row) * es);
      } else {
        for (int64_t i = 0; i < T * row; ++i) st(cx->p(id), od, (cb * S + p0) * row + i, ld(cx->p(x), dx, b * T * row + i));
      }
    }
  };
}

}  // namespace trl::cpu

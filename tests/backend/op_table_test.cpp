// The op table, in the style of ggml's test-backend-ops: every op of graph::Op (Input aside) with shape cases —
// sizes 1, 7, 129 and each kernel's boundaries (the GEMV path for M <= 8 rows, the 64-row query blocks of
// attention, the 4096-column vocabulary chunks) in f32 and bf16 — built with graph::Builder on seeded random
// inputs, run on every backend under test and compared with the reference backend (the oracle). Then the VJP of
// every differentiable forward op against central finite differences on the reference (f64), and the same
// forward+backward graphs on the backends. With TRL_OP_PERF=1, OpTable.Perf prints time per run and GFLOP/s or
// GB/s of medium shapes on each backend.
//
// A new backend: one line in backends_under_test(). A new op: OpTable.EveryOpHasCases fails until it has cases.
// TRL_OP_VERBOSE=1 prints the error of every comparison (to choose tolerances for a new backend).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/rng.h"
#include "graph/autodiff.h"
#include "graph/passes.h"
#include "trl/backend/backend.h"
#include "trl/core/collectives.h"
#include "trl/backend/cpu/cpu_backend.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/graph/graph.h"

namespace trl {
namespace {

using graph::Builder;
using graph::kNone;
using graph::Op;
using graph::ValueId;

// ---- the backends under test: the one place to add one ----

using BackendFactory = std::function<std::unique_ptr<Backend>()>;
using Backends = std::vector<std::pair<std::string, BackendFactory>>;

Backends backends_under_test() {
  Backends out;
  for (const std::string& name : available_backends())
    if (name != "reference") out.emplace_back(name, [name] { return make_backend(name); });
  return out;
}

// ---- tolerances ----
// An output passes when max_i |got_i - want_i| <= tol · max(max_i |want_i|, floor): the error is measured against
// the largest value of the reference output (so a sum that cancels to ~0 is not held to a relative error it
// cannot have), and non-finite values never pass (see compare()).
constexpr double kExact = 0;    // data movement (embedding, cast, reshape, slice, kv_cache_write, view, fill), argmax: equal values
constexpr double kF32 = 1e-5;   // f32 arithmetic: f32 accumulation in another order against the oracle's f64
constexpr double kBF16 = 1e-2;  // bf16 values or rounding points: ~1-2.5 bf16 steps (2^-8 .. 2^-7) of the largest value
// attention_backward with bf16 GEMMs (bf16 q, k, v and dy): the CPU backend rounds P, dS and the GEMM operands to
// bf16 as autocast does, the oracle keeps the whole backward pass in f64 (errors up to ~1e-2 of the largest value).
constexpr double kBF16AttentionBackward = 3e-2;
double tol_of(DType dt) { return dt == DType::BF16 ? kBF16 : kF32; }

bool verbose() {
  const char* v = std::getenv("TRL_OP_VERBOSE");
  return v != nullptr && std::string(v) == "1";
}

// ---- the compare helper ----

struct Comparison {
  bool ok = true;
  std::string problem;  // what failed (empty when ok)
  int64_t index = -1;   // the worst element, or the first offending one
  double expected = 0, got = 0;
  double error = 0;  // worst |got - expected| / scale
  double scale = 0;  // max(largest finite |expected|, floor)
};

// Element by element, with explicit finiteness checks: a NaN or Inf in `got` where `want` is finite fails, and so
// does a non-finite value in `want` itself unless `nonfinite_expected` (then got must be the same NaN / same Inf).
// No std::max over |a - b| (which would let a NaN slip through).
Comparison compare(const std::vector<double>& want, const std::vector<double>& got, double tol, bool nonfinite_expected = false,
                   double floor = 1e-6) {
  Comparison c;
  auto fail_at = [&](size_t i, const std::string& why) {
    c.ok = false;
    c.problem = why;
    c.index = static_cast<int64_t>(i);
    c.expected = want[i];
    c.got = got[i];
    return c;
  };
  if (want.size() != got.size()) {
    c.ok = false;
    c.problem = fmt::format("{} values where the reference has {}", got.size(), want.size());
    return c;
  }
  double largest = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], g = got[i];
    if (!std::isfinite(w)) {
      if (!nonfinite_expected) return fail_at(i, "the reference itself is not finite (NaN/Inf)");
      const bool same = std::isnan(w) ? std::isnan(g) : g == w;
      if (!same) return fail_at(i, "a non-finite reference value is not reproduced");
      continue;
    }
    if (!std::isfinite(g)) return fail_at(i, "not finite (NaN/Inf) where the reference is finite");
    if (std::fabs(w) > largest) largest = std::fabs(w);
  }
  c.scale = largest > floor ? largest : floor;
  bool first = true;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) continue;
    const double err = std::fabs(got[i] - want[i]) / c.scale;  // both finite here
    if (first || err > c.error) {
      first = false;
      c.error = err;
      c.index = static_cast<int64_t>(i);
      c.expected = want[i];
      c.got = got[i];
    }
  }
  c.ok = c.error <= tol;  // false for a NaN error too
  if (!c.ok) c.problem = "error above tolerance";
  return c;
}

std::string describe(const Comparison& c, double tol) {
  if (c.index < 0) return c.problem;
  const std::string at = fmt::format("{}: at index {} expected {:.9g}, got {:.9g}", c.problem, c.index, c.expected, c.got);
  if (c.problem != "error above tolerance") return at;
  return fmt::format("{}; |got - expected| / scale = {:.3g} (scale {:.3g}, tolerance {:.3g})", at, c.error, c.scale, tol);
}

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (dtype_is_float(t.dtype())) {
    for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = load_element(t.data(), t.dtype(), i);
  } else {
    const std::vector<int64_t> x = t.to_i64_vector();
    for (size_t i = 0; i < x.size(); ++i) v[i] = static_cast<double>(x[i]);
  }
  return v;
}

// ---- a case: builds its graph and its (seeded) inputs ----

class Ctx {
 public:
  explicit Ctx(uint64_t seed) : rng(seed) {}
  Builder b;
  TensorMap inputs;
  std::set<std::string> in_place;  // inputs a backend may update in place (the static KV cache)
  SplitMix64 rng;

  // A float input of (approximately) normal values times `scale`, rounded to `dt`.
  ValueId rand(const std::string& name, const Shape& shape, DType dt, double scale = 1.0) {
    Tensor t = Tensor::zeros(dt, shape);
    for (int64_t i = 0; i < t.numel(); ++i) store_element(t.mutable_data(), dt, i, scale * rng.normal());
    return bind(name, t);
  }
  // The same, rounded to multiples of 1/4 (dot products of a few of them are exact in f32, in any order).
  ValueId quarters(const std::string& name, const Shape& shape, DType dt) {
    Tensor t = Tensor::zeros(dt, shape);
    for (int64_t i = 0; i < t.numel(); ++i) store_element(t.mutable_data(), dt, i, std::round(4 * rng.normal()) / 4);
    return bind(name, t);
  }
  // An i32 input of uniform values in [0, range).
  ValueId ids(const std::string& name, const Shape& shape, int64_t range) {
    Tensor t = Tensor::zeros(DType::I32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(range));
    return bind(name, t);
  }
  ValueId i32(const std::string& name, const Shape& shape, const std::vector<int32_t>& v) {
    return bind(name, Tensor::from_i32(v, shape));
  }
  ValueId vals(const std::string& name, const Shape& shape, DType dt, const std::vector<double>& v) {
    Tensor t = Tensor::zeros(dt, shape);
    EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel()) << name;
    for (int64_t i = 0; i < t.numel(); ++i) store_element(t.mutable_data(), dt, i, v[static_cast<size_t>(i)]);
    return bind(name, t);
  }
  // Attention segment ids [B,S] as packing makes them: a run of segment 1, then of segment 2, ~20% padding (0).
  ValueId segments(const std::string& name, int64_t B, int64_t S) {
    std::vector<int32_t> m(static_cast<size_t>(B * S));
    for (int64_t i = 0; i < B * S; ++i)
      m[static_cast<size_t>(i)] = static_cast<int32_t>(1 + (i % S) * 2 / S) * (rng.next() % 5 != 0 ? 1 : 0);
    return i32(name, {B, S}, m);
  }
  Tensor& data(const std::string& name) { return inputs.at(name); }
  void out(ValueId v) { b.output(v); }

 private:
  ValueId bind(const std::string& name, const Tensor& t) {
    const ValueId id = b.input(name, t.shape(), t.dtype());
    inputs[name] = t;
    return id;
  }
};

struct OpCase {
  Op op = Op::Input;  // the op under test (the graph must contain a live node of it)
  std::string name;   // dtypes and shapes
  double tol = 0;
  std::function<void(Ctx&)> build;
  bool nonfinite_expected = false;  // the reference output has NaN/Inf on purpose (cast of special values)
  bool zeros_expected = false;      // the reference output may be all zeros (else the case is degenerate: a failure)
  bool unfused = false;             // also run it on each backend without graph passes (the ops' own lowerings)
  double floor = 1e-6;
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << graph::op_name(c.op) << " " << c.name; }

uint64_t seed_of(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

TensorMap clone_all(const TensorMap& m) {
  TensorMap out;
  for (const auto& [k, v] : m) out[k] = v.clone();
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Runs the case on the reference and on each backend — twice per backend: a compiled program must give the same
// on its second run — and compares every output. Also fails when a backend modifies an input (other than an
// in-place KV cache), throws (the CPU backend's guard check throws on a write past an output), or returns outputs
// of the wrong shape or dtype. Failures are non-fatal and name op, case, backend, run and output.
void check_case(const OpCase& c, const Backends& backends) {
  ::setenv("TRL_CHECK_GUARDS", "1", 1);  // before compiling: the CPU backend reads it at compile time
  Ctx ctx(seed_of(c.name));
  c.build(ctx);
  const graph::Graph g = ctx.b.finish();
  const std::string where = fmt::format("op {}, case '{}'", graph::op_name(c.op), c.name);
  ASSERT_FALSE(g.outputs.empty()) << where;
  const graph::Graph live = graph::eliminate_dead_code(g);
  ASSERT_TRUE(std::any_of(live.nodes.begin(), live.nodes.end(), [&](const graph::Node& n) { return n.op == c.op; }))
      << where << ": no output depends on a " << graph::op_name(c.op) << " node";

  std::vector<Tensor> want;
  try {
    want = make_reference_backend()->compile(g)->run(clone_all(ctx.inputs));
  } catch (const std::exception& e) {
    FAIL() << where << ": the reference backend failed: " << e.what();
  }
  ASSERT_EQ(want.size(), g.outputs.size()) << where;
  bool any_nonzero = false;
  for (size_t k = 0; k < want.size(); ++k) {
    const std::vector<double> v = values_of(want[k]);
    for (size_t i = 0; i < v.size(); ++i) {
      any_nonzero = any_nonzero || v[i] != 0;
      if (!c.nonfinite_expected && !std::isfinite(v[i])) {
        ADD_FAILURE() << where << ": reference output " << k << " is not finite at index " << i << " (" << v[i] << ")";
        break;
      }
    }
  }
  if (!c.zeros_expected) {
    EXPECT_TRUE(any_nonzero) << where << ": every reference output is zero (a degenerate case)";
  }

  Backends runs = backends;
  if (c.unfused)
    for (const auto& [bname, make] : backends)
      runs.emplace_back(bname + " without graph passes", [name = bname] { return make_backend(name, BackendOptions{.graph_passes = false}); });
  for (const auto& [bname, make] : runs) {
    const std::string at = where + ", backend " + bname;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Program> program;
    try {
      backend = make();
      program = backend->compile(g);
    } catch (const std::exception& e) {
      ADD_FAILURE() << at << ": compile failed: " << e.what();
      continue;
    }
    for (int run = 1; run <= 2; ++run) {
      const TensorMap in = clone_all(ctx.inputs);
      std::vector<Tensor> got;
      try {
        got = program->run(in);
      } catch (const std::exception& e) {
        ADD_FAILURE() << at << ", run " << run << ": " << e.what();
        break;
      }
      for (const auto& [name, t] : ctx.inputs) {
        if (!ctx.in_place.count(name) && !same_bytes(t, in.at(name))) ADD_FAILURE() << at << ", run " << run << ": the backend modified input '" << name << "'";
      }
      if (got.size() != want.size()) {
        ADD_FAILURE() << at << ", run " << run << ": " << got.size() << " outputs, expected " << want.size();
        break;
      }
      for (size_t k = 0; k < want.size(); ++k) {
        const graph::Node& o = g.node(g.outputs[k]);
        const std::string what =
            fmt::format("{}, run {}, output {} ({} '{}' {} {})", at, run, k, graph::op_name(o.op), o.name, shape_str(o.shape), dtype_name(o.dtype));
        if (got[k].shape() != want[k].shape() || got[k].dtype() != want[k].dtype()) {
          ADD_FAILURE() << what << ": got " << shape_str(got[k].shape()) << " " << dtype_name(got[k].dtype());
          continue;
        }
        const Comparison cmp = compare(values_of(want[k]), values_of(got[k]), c.tol, c.nonfinite_expected, c.floor);
        if (verbose() && run == 1)
          std::printf("[op-table] %-24s %-58s %-5s out %zu  error %.3g  (tol %.3g)\n", graph::op_name(c.op), c.name.c_str(), bname.c_str(), k,
                      cmp.error, c.tol);
        EXPECT_TRUE(cmp.ok) << what << ": " << describe(cmp, c.tol);
      }
    }
  }
}

// ---- the table ----

std::string dims(const Shape& s) {
  if (s.empty()) return "scalar";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += 'x';
    out += std::to_string(s[i]);
  }
  return out;
}
std::string dn(DType d) { return std::string(dtype_name(d)); }

OpCase& add_case(std::vector<OpCase>& t, Op op, std::string name, double tol, std::function<void(Ctx&)> build) {
  OpCase c;
  c.op = op;
  c.name = std::move(name);
  c.tol = tol;
  c.build = std::move(build);
  t.push_back(std::move(c));
  return t.back();
}

// Qwen3's inverse frequencies (theta 1e6), in f32 as Transformers computes them.
std::vector<float> inv_freq(int64_t D) {
  std::vector<float> f(static_cast<size_t>(D / 2));
  for (int64_t j = 0; j < D / 2; ++j) f[static_cast<size_t>(j)] = static_cast<float>(1.0 / std::pow(1e6, 2.0 * static_cast<double>(j) / static_cast<double>(D)));
  return f;
}

constexpr DType F32 = DType::F32, BF16 = DType::BF16, F16 = DType::F16, I32 = DType::I32;

void embedding_cases(std::vector<OpCase>& t) {
  struct S {
    int64_t B, T, V, C;
  };
  for (const S s : {S{1, 1, 1, 1}, S{2, 7, 129, 7}, S{1, 129, 7, 129}, S{2, 3, 4099, 16}})
    for (const auto& [td, od] : std::vector<std::pair<DType, DType>>{{F32, F32}, {BF16, BF16}, {BF16, F32}, {F32, BF16}})
      add_case(t, Op::Embedding, fmt::format("table {} {}x{} -> {}, ids {}x{}", dn(td), s.V, s.C, dn(od), s.B, s.T), kExact, [=, od = od, td = td](Ctx& c) {
        const ValueId ids = c.ids("ids", {s.B, s.T}, s.V);
        c.out(c.b.embedding(ids, c.rand("table", {s.V, s.C}, td), od));
      });
}

void matmul_cases(std::vector<OpCase>& t) {
  // x:[..., K] rows M = 1..8 take the GEMV path of the CPU backend, M > 8 the GEMM; K = 300 crosses the 128- and
  // 32-wide blocks of the bf16 dot kernels with a tail. On a CPU with AMX tiles, bf16 x bf16 with M = 2..16, K >= 32
  // and N >= 16 takes the tile GEMV: 16-row weight blocks four at a time (N = 129: 8 blocks and 1 row; N = 80: 4 + 1
  // blocks), then one at a time, the K % 32 columns (300, 40) and the N % 16 rows finished by the vector kernel.
  const std::vector<std::pair<Shape, int64_t>> shapes = {{{1, 1}, 1},      {{1, 129}, 7},   {{1, 300}, 129}, {{7, 7}, 129},  {{8, 129}, 7},
                                                         {{8, 300}, 33},   {{9, 129}, 7},   {{129, 7}, 129}, {{129, 129}, 1}, {{2, 7, 33}, 7},
                                                         {{3, 1, 64}, 5},  {{2, 64}, 16},   {{5, 96}, 80},   {{16, 300}, 129}, {{2, 8, 40}, 70}};
  struct D {
    DType x, w, out;
    bool bias;
  };
  int i = 0;
  for (const auto& [xs, N] : shapes) {
    const int64_t K = xs.back();
    for (const D d : {D{F32, F32, F32, i % 2 == 0}, D{BF16, BF16, BF16, false}, D{BF16, BF16, F32, true}, D{F32, BF16, F32, false}, D{BF16, F32, F32, i % 2 == 1}}) {
      const double tol = d.out == BF16 ? kBF16 : kF32;
      add_case(t, Op::MatMul, fmt::format("x {} {} w {} {}x{}{} -> {}", dn(d.x), dims(xs), dn(d.w), N, K, d.bias ? " bias" : "", dn(d.out)), tol,
               [=, N = N, xs = xs](Ctx& c) {
                 const ValueId x = c.rand("x", xs, d.x), w = c.rand("w", {N, K}, d.w);
                 const ValueId b = d.bias ? c.rand("b", {N}, F32) : kNone;
                 c.out(c.b.matmul(x, w, b, d.out));
               });
    }
    ++i;
  }
  add_case(t, Op::MatMul, "x bf16 7x33 w bf16 9x33 bias bf16 -> bf16", kBF16, [](Ctx& c) {
    c.out(c.b.matmul(c.rand("x", {7, 33}, BF16), c.rand("w", {9, 33}, BF16), c.rand("b", {9}, BF16), BF16));
  });
  // An addend the GEMM accumulates into (LoRA's B into the base output): an input (copied first) or a computed value
  // nothing else reads (written over in place); GEMV rows and GEMM rows.
  for (const int64_t M : {3, 12, 65})
    for (DType dt : {F32, BF16})
      for (const bool computed : {false, true})
        add_case(t, Op::MatMul, fmt::format("{} x {}x32 w 40x32 + {} addend", dn(dt), M, computed ? "computed (in place)" : "input"), tol_of(dt),
                 [=](Ctx& c) {
                   ValueId addend = c.rand("addend", {M, 40}, dt);
                   if (computed) addend = c.b.add(addend, c.rand("addend2", {M, 40}, dt));
                   c.out(c.b.matmul(c.rand("x", {M, 32}, dt), c.rand("w", {40, 32}, dt), kNone, dt, "", addend));
                 });
}

void rms_norm_cases(std::vector<OpCase>& t) {
  const std::vector<std::pair<Shape, double>> shapes = {{{1, 1}, 1e-6}, {{7, 7}, 1e-6}, {{7, 8}, 1e-6}, {{129, 129}, 1e-6}, {{2, 3, 64}, 1e-6}, {{5, 16}, 0.5}};
  for (const auto& [xs, eps] : shapes)
    for (const auto& [xd, wd] : std::vector<std::pair<DType, DType>>{{F32, F32}, {BF16, BF16}, {BF16, F32}, {F32, BF16}})
      add_case(t, Op::RmsNorm, fmt::format("x {} {} w {} eps {}", dn(xd), dims(xs), dn(wd), eps), xd == BF16 ? kBF16 : kF32, [=, eps = eps, wd = wd, xd = xd, xs = xs](Ctx& c) {
        c.out(c.b.rms_norm(c.rand("x", xs, xd), c.rand("w", {xs.back()}, wd), eps));
      });
}

void rope_cases(std::vector<OpCase>& t) {
  struct S {
    int64_t B, T, H, D;
    float scaling;
  };
  for (const S s : {S{1, 1, 1, 2, 1.0f}, S{2, 7, 3, 8, 1.0f}, S{1, 129, 2, 16, 1.0f}, S{1, 3, 2, 128, 1.0f}, S{2, 5, 1, 8, 0.75f}, S{1, 2, 1, 1030, 1.0f}})
    for (DType dt : {F32, BF16}) {
      const Shape xs = {s.B, s.T, s.H, s.D};
      add_case(t, Op::Rope, fmt::format("{} x {} positions < 4096 scaling {}", dn(dt), dims(xs), s.scaling), tol_of(dt), [=](Ctx& c) {
        const ValueId x = c.rand("x", xs, dt), pos = c.ids("pos", {s.B, s.T}, 4096);
        c.out(c.b.rope(x, pos, inv_freq(s.D), s.scaling));
      });
      if (s.T == 1) continue;
      // The VJP's rotation by -angle (rope_inverse), alone and composed with the forward rotation.
      add_case(t, Op::Rope, fmt::format("{} inverse dy {}", dn(dt), dims(xs)), tol_of(dt), [=](Ctx& c) {
        const ValueId x = c.rand("x", xs, dt), pos = c.ids("pos", {s.B, s.T}, 4096), dy = c.rand("dy", xs, dt);
        const ValueId fwd = c.b.rope(x, pos, inv_freq(s.D), s.scaling);
        const graph::Node fwd_node = c.b.node(fwd);
        c.out(fwd);
        c.out(c.b.rope_inverse(dy, fwd_node));
        c.out(c.b.rope_inverse(fwd, fwd_node));
      });
    }
}

struct Att {
  int64_t B, T, S, H, Hkv, D;
  bool mask, causal;
};
std::string att_name(const Att& a, DType q, DType kv) {
  return fmt::format("q {} {}x{}x{}x{} kv {} S{} Hkv{}{}{}", dn(q), a.B, a.T, a.H, a.D, dn(kv), a.S, a.Hkv, a.mask ? " segments" : "",
                     a.causal ? " causal" : " non-causal");
}
// The shapes of attention and its backward: T = 1 and 7, T = 65 and 129 across 64-row query blocks (a ragged last
// block), a KV offset (S > T), GQA (H a multiple of Hkv, up to 4), packed segments with padding, non-causal.
// (Not T > S: the Builder accepts it when non-causal, but the reference forward rejects the negative query index.)
const std::vector<Att>& att_shapes() {
  static const std::vector<Att> a = {
      {1, 1, 1, 1, 1, 1, false, true},    {2, 7, 7, 4, 2, 8, true, true},     {2, 7, 10, 4, 1, 8, true, true}, {1, 129, 129, 2, 2, 16, false, true},
      {1, 129, 140, 3, 1, 16, true, true}, {1, 65, 65, 2, 1, 32, true, true}, {2, 7, 9, 2, 2, 8, true, false}, {1, 70, 90, 2, 1, 8, false, false},
      {2, 1, 16, 4, 2, 8, true, true}};
  return a;
}

void attention_cases(std::vector<OpCase>& t) {
  for (const Att& a : att_shapes()) {
    std::vector<std::pair<DType, DType>> dts = {{F32, F32}, {BF16, BF16}};
    if (a.T == 7 || a.T == 129) dts.push_back({F32, BF16});  // mixed dtypes: the CPU backend converts per task
    for (const auto& [qd, kd] : dts)
      add_case(t, Op::Attention, att_name(a, qd, kd), qd == BF16 || kd == BF16 ? kBF16 : kF32, [=, kd = kd, qd = qd](Ctx& c) {
        const ValueId q = c.rand("q", {a.B, a.T, a.H, a.D}, qd), k = c.rand("k", {a.B, a.S, a.Hkv, a.D}, kd), v = c.rand("v", {a.B, a.S, a.Hkv, a.D}, kd);
        const ValueId m = a.mask ? c.segments("mask", a.B, a.S) : kNone;
        c.out(c.b.attention(q, k, v, m, 1.0 / std::sqrt(static_cast<double>(a.D)), a.causal));
      });
  }
  // Queries at cache positions q_pos (a static KV cache): decoding, a prefill chunk at an offset, non-causal,
  // packed segments in the cache, a long chunk.
  struct Q {
    std::string what;
    int64_t B, T, S, H, Hkv, D;
    bool causal;
    std::vector<int32_t> qpos;
    std::vector<int32_t> mask;  // empty: none
  };
  auto range = [](int32_t from, int32_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + i;
    return v;
  };
  std::vector<int32_t> left_pad(32, 1);
  for (int i = 16; i < 19; ++i) left_pad[static_cast<size_t>(i)] = 0;  // row 1 is left-padded by 3
  std::vector<int32_t> segs(80, 0);
  for (int i = 0; i < 80; ++i) segs[static_cast<size_t>(i)] = (i * 7) % 5 == 0 ? 0 : 1 + (i % 40) / 20;
  const std::vector<Q> qs = {
      {"decode", 2, 1, 16, 4, 2, 8, true, {5, 15}, left_pad},
      {"prefill chunk at 10", 1, 7, 40, 2, 1, 16, true, range(10, 7), {}},
      {"non-causal", 2, 3, 12, 2, 2, 8, false, {0, 5, 11, 3, 4, 9}, {}},
      {"packed segments in the cache", 1, 4, 12, 2, 2, 8, true, {5, 6, 7, 8}, {1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0, 0}},
      {"non-causal segments", 2, 3, 40, 2, 1, 8, false, {0, 25, 39, 7, 30, 13}, segs},
      {"long chunk at 20", 1, 70, 100, 2, 1, 8, true, range(20, 70), {}},
  };
  for (const Q& q : qs)
    for (DType dt : {F32, BF16})
      add_case(t, Op::Attention, fmt::format("{} q_pos {} q {}x{}x{}x{} S{} Hkv{}", dn(dt), q.what, q.B, q.T, q.H, q.D, q.S, q.Hkv), tol_of(dt), [=](Ctx& c) {
        const ValueId qv = c.rand("q", {q.B, q.T, q.H, q.D}, dt), k = c.rand("k", {q.B, q.S, q.Hkv, q.D}, dt), v = c.rand("v", {q.B, q.S, q.Hkv, q.D}, dt);
        const ValueId m = q.mask.empty() ? kNone : c.i32("mask", {q.B, q.S}, q.mask);
        const ValueId p = c.i32("q_pos", {q.B, q.T}, q.qpos);
        c.out(c.b.attention(qv, k, v, m, 1.0 / std::sqrt(static_cast<double>(q.D)), q.causal, "", p));
      });
  // A decoding step as the generator builds it: write k, v at the cache position, attend from it.
  for (DType dt : {F32, BF16})
    add_case(t, Op::Attention, fmt::format("{} decode step after kv_cache_write S16", dn(dt)), tol_of(dt), [=](Ctx& c) {
      const ValueId kc = c.rand("k_cache", {2, 16, 2, 8}, dt), vc = c.rand("v_cache", {2, 16, 2, 8}, dt);
      c.in_place = {"k_cache", "v_cache"};
      const ValueId q = c.rand("q", {2, 1, 4, 8}, dt), k = c.rand("k", {2, 1, 2, 8}, dt), v = c.rand("v", {2, 1, 2, 8}, dt);
      const ValueId pos = c.i32("pos", {1}, {6}), qpos = c.i32("q_pos", {2, 1}, {6, 6});
      const ValueId kw = c.b.kv_cache_write(kc, k, pos), vw = c.b.kv_cache_write(vc, v, pos);
      c.out(c.b.attention(q, kw, vw, kNone, 0.35, true, "", qpos));
      c.out(kw);
      c.out(vw);
    });
  // Continuous batching (CausalLM::slots_graph): 3 query rows over a cache of 5 rows, each at its own slot and row
  // (one row twice: two queries of one sequence never happen, but the reads must still be right), with a 2-token
  // chunk per row, and a padding row pointing at the scratch row with a mask of zeros.
  for (DType dt : {F32, BF16})
    add_case(t, Op::Attention, fmt::format("{} cache rows: 3 rows of 2 tokens over a 5-row cache S12", dn(dt)), tol_of(dt), [=](Ctx& c) {
      const ValueId kc = c.rand("k_cache", {5, 12, 2, 8}, dt), vc = c.rand("v_cache", {5, 12, 2, 8}, dt);
      c.in_place = {"k_cache", "v_cache"};
      const ValueId q = c.rand("q", {3, 2, 4, 8}, dt), k = c.rand("k", {3, 2, 2, 8}, dt), v = c.rand("v", {3, 2, 2, 8}, dt);
      const ValueId pos = c.i32("pos", {3}, {4, 9, 0}), rows = c.i32("rows", {3}, {3, 0, 4});
      const ValueId qpos = c.i32("q_pos", {3, 2}, {4, 5, 9, 10, 0, 1});
      std::vector<int32_t> mask(3 * 12, 0);
      for (int j = 1; j <= 5; ++j) mask[static_cast<size_t>(j)] = 1;        // row 0: slots 1..5
      for (int j = 0; j <= 10; ++j) mask[static_cast<size_t>(12 + j)] = 1;  // row 1: slots 0..10
      const ValueId m = c.i32("mask", {3, 12}, mask);
      const ValueId kw = c.b.kv_cache_write(kc, k, pos, "", rows), vw = c.b.kv_cache_write(vc, v, pos, "", rows);
      c.out(c.b.attention(q, kw, vw, m, 0.35, true, "", qpos, rows));
      c.out(kw);
      c.out(vw);
    });
}

void elementwise_cases(std::vector<OpCase>& t) {
  for (const Shape& s : std::vector<Shape>{{1}, {7}, {3, 129}, {2, 3, 7}})
    for (DType dt : {F32, BF16})
      add_case(t, Op::SwiGLU, fmt::format("{} {}", dn(dt), dims(s)), tol_of(dt), [=](Ctx& c) { c.out(c.b.swiglu(c.rand("gate", s, dt), c.rand("up", s, dt))); });
  for (DType dt : {F32, BF16})  // gates up to ±100: e^-g overflows f32
    add_case(t, Op::SwiGLU, fmt::format("{} 129 saturated gates", dn(dt)), tol_of(dt),
             [=](Ctx& c) { c.out(c.b.swiglu(c.rand("gate", {129}, dt, 30.0), c.rand("up", {129}, dt))); });

  for (const Shape& s : std::vector<Shape>{{1}, {7}, {129}, {3, 5, 129}})
    for (const auto& [a, b] : std::vector<std::pair<DType, DType>>{{F32, F32}, {BF16, BF16}, {BF16, F32}, {F32, BF16}})
      add_case(t, Op::Add, fmt::format("{} + {} {}", dn(a), dn(b), dims(s)), a == BF16 ? kBF16 : kF32,
               [=, a = a, b = b](Ctx& c) { c.out(c.b.add(c.rand("a", s, a), c.rand("b", s, b))); });

  for (const Shape& s : std::vector<Shape>{{1}, {7}, {3, 129}})
    for (const auto& [w, o] : std::vector<std::pair<DType, DType>>{{F32, F32}, {BF16, F32}, {F32, BF16}})
      add_case(t, Op::ScaleBy, fmt::format("{} {} times f32 scalar -> {}", dn(w), dims(s), dn(o)), tol_of(o),
               [=, o = o, w = w](Ctx& c) { c.out(c.b.scale_by(c.rand("w", s, w), c.rand("s", {}, F32), o)); });

  for (const Shape& s : std::vector<Shape>{{1}, {7}, {3, 129}, {2, 3, 4099}})
    for (DType xd : {F32, BF16})
      for (double p : {0.0, 0.05, 0.5})
        if (shape_numel(s) > 1 || p == 0)  // one element under p > 0 may well be dropped (a degenerate case)
          add_case(t, Op::Dropout, fmt::format("{} {} p {}", dn(xd), dims(s), p), tol_of(xd),
                 [=](Ctx& c) { c.out(c.b.dropout(c.rand("x", s, xd), c.i32("seed", {2}, {1234, -7}), p, 3)); });

  for (const Shape& s : std::vector<Shape>{{1}, {7}, {3, 129}, {4099}})
    for (DType xd : {F32, BF16})
      add_case(t, Op::WeightedSum, fmt::format("x {} {} weights f32", dn(xd), dims(s)), kF32,
               [=](Ctx& c) { c.out(c.b.weighted_sum(c.rand("x", s, xd), c.rand("weights", s, F32))); });
}

// all_reduce and all_reduce_grad in one process: group kFakeGroup stands for two ranks holding the same x, so its
// sum is 2x (the kernels must call the group, not copy). Their VJPs are tested across 2 ranks
// (tests/dist/tensor_parallel_test.cpp).
constexpr int32_t kFakeGroup = 91;
int32_t fake_group() {
  set_collective_group(kFakeGroup, [](void* data, int64_t n, DType dtype) {
    for (int64_t i = 0; i < n; ++i) store_element(data, dtype, i, 2 * load_element(data, dtype, i));
  });
  return kFakeGroup;
}
void collective_cases(std::vector<OpCase>& t) {
  fake_group();
  for (const Shape& s : std::vector<Shape>{{1}, {7}, {3, 129}})
    for (DType dt : {F32, BF16}) {
      add_case(t, Op::AllReduce, fmt::format("{} {} over 2 equal ranks", dn(dt), dims(s)), kExact,
               [=](Ctx& c) { c.out(c.b.all_reduce(c.rand("x", s, dt), kFakeGroup)); });
      add_case(t, Op::AllReduceGrad, fmt::format("{} {}", dn(dt), dims(s)), kExact,
               [=](Ctx& c) { c.out(c.b.all_reduce_grad(c.rand("x", s, dt), kFakeGroup)); });
    }
}

void data_movement_cases(std::vector<OpCase>& t) {
  // Cast: random values, then the special ones (signed zero, bf16 rounding ties, overflow past the largest f16, a
  // denormal, ±Inf, NaN), which must come out as the same values (NaN as NaN, each infinity with its sign).
  for (const Shape& s : std::vector<Shape>{{1}, {7}, {5, 129}})
    for (const auto& [from, to] : std::vector<std::pair<DType, DType>>{{F32, BF16}, {BF16, F32}, {F32, F16}, {F16, F32}, {BF16, F16}, {F32, F32}})
      add_case(t, Op::Cast, fmt::format("{} -> {} {}", dn(from), dn(to), dims(s)), kExact, [=, from = from, to = to](Ctx& c) { c.out(c.b.cast(c.rand("x", s, from, 100.0), to)); });
  const std::vector<double> special = {0.0, -0.0, 1.0, -1.0, 1.00390625, 1.01171875, 3.0e38, -3.0e38, 1e-40, 65504.0, 70000.0, INFINITY, -INFINITY, NAN, 0.1, -7.25};
  for (const auto& [from, to] : std::vector<std::pair<DType, DType>>{{F32, BF16}, {F32, F16}, {BF16, F32}})
    add_case(t, Op::Cast, fmt::format("{} -> {} special values", dn(from), dn(to)), kExact, [=, from = from, to = to](Ctx& c) {
      c.out(c.b.cast(c.vals("x", {static_cast<int64_t>(special.size())}, from, special), to));
    }).nonfinite_expected = true;

  for (DType dt : {F32, BF16})
    add_case(t, Op::Reshape, fmt::format("{} input 2x3x4 -> 4x6", dn(dt)), kExact, [=](Ctx& c) { c.out(c.b.reshape(c.rand("x", {2, 3, 4}, dt), {4, 6})); });
  add_case(t, Op::Reshape, "f32 1 -> scalar", kExact, [](Ctx& c) { c.out(c.b.reshape(c.rand("x", {1}, F32), {})); });
  add_case(t, Op::Reshape, "i32 2x7 -> 14", kExact, [](Ctx& c) { c.out(c.b.reshape(c.ids("x", {2, 7}, 100), {14})); });
  add_case(t, Op::Reshape, "f32 computed 3x129 -> 129x3, then add", kF32, [](Ctx& c) {
    const ValueId r = c.b.reshape(c.b.add(c.rand("a", {3, 129}, F32), c.rand("b", {3, 129}, F32)), {129, 3});
    c.out(c.b.add(r, c.rand("c", {129, 3}, F32)));
    c.out(r);
  });

  struct Sl {
    Shape x;
    int64_t start, len;
  };
  for (const Sl& s : {Sl{{1, 1, 3}, 0, 1}, Sl{{2, 7, 2, 3}, 3, 4}, Sl{{2, 129, 5}, 128, 1}, Sl{{1, 129, 4}, 0, 129}, Sl{{3, 7}, 6, 1}})
    for (DType dt : {F32, BF16, I32})
      add_case(t, Op::Slice, fmt::format("{} {} rows [{}, {})", dn(dt), dims(s.x), s.start, s.start + s.len), kExact, [=](Ctx& c) {
        const ValueId x = dt == I32 ? c.ids("x", s.x, 1000) : c.rand("x", s.x, dt);
        c.out(c.b.slice(x, s.start, s.len));
      });
  add_case(t, Op::Slice, "f32 computed 2x9x4 rows [2, 7)", kF32, [](Ctx& c) {
    c.out(c.b.slice(c.b.add(c.rand("a", {2, 9, 4}, F32), c.rand("b", {2, 9, 4}, F32)), 2, 5));
  });

  struct Kv {
    int64_t B, S, Hkv, D, T;
    int32_t pos;
  };
  for (const Kv k : {Kv{1, 1, 1, 1, 1, 0}, Kv{2, 16, 2, 8, 7, 3}, Kv{2, 16, 2, 8, 1, 15}, Kv{1, 129, 2, 4, 129, 0}, Kv{2, 9, 1, 7, 4, 5}})
    for (const auto& [cd, xd] : std::vector<std::pair<DType, DType>>{{BF16, BF16}, {F32, F32}, {BF16, F32}})
      add_case(t, Op::KvCacheWrite, fmt::format("cache {} {}x{}x{}x{} x {} T{} at {}", dn(cd), k.B, k.S, k.Hkv, k.D, dn(xd), k.T, k.pos), kExact, [=, cd = cd, xd = xd](Ctx& c) {
        const ValueId cache = c.rand("cache", {k.B, k.S, k.Hkv, k.D}, cd);
        c.in_place = {"cache"};
        c.out(c.b.kv_cache_write(cache, c.rand("x", {k.B, k.T, k.Hkv, k.D}, xd), c.i32("pos", {1}, {k.pos})));
      });
  // Per-row slots, and rows of a larger cache (continuous batching): x's row b at slot pos[b] of cache row rows[b].
  for (DType cd : {BF16, F32}) {
    add_case(t, Op::KvCacheWrite, fmt::format("cache {} 3x16x2x8 x T1 per-row slots 0, 15, 7", dn(cd)), kExact, [=](Ctx& c) {
      const ValueId cache = c.rand("cache", {3, 16, 2, 8}, cd);
      c.in_place = {"cache"};
      c.out(c.b.kv_cache_write(cache, c.rand("x", {3, 1, 2, 8}, cd), c.i32("pos", {3}, {0, 15, 7})));
    });
    add_case(t, Op::KvCacheWrite, fmt::format("cache {} 6x16x2x8 x 2x4 into rows 5, 1 at 12, 0", dn(cd)), kExact, [=](Ctx& c) {
      const ValueId cache = c.rand("cache", {6, 16, 2, 8}, cd);
      c.in_place = {"cache"};
      c.out(c.b.kv_cache_write(cache, c.rand("x", {2, 4, 2, 8}, cd), c.i32("pos", {2}, {12, 0}), "", c.i32("rows", {2}, {5, 1})));
    });
  }

  struct F {
    Shape s;
    DType dt;
    double value;
  };
  for (const F& f : {F{{}, F32, 1.0}, F{{7}, F32, -0.3}, F{{7}, BF16, -0.3}, F{{3, 129}, F32, 0.0}, F{{3, 129}, BF16, 1.0}, F{{1}, BF16, 1e30}})
    add_case(t, Op::Fill, fmt::format("{} {} value {}", dn(f.dt), dims(f.s), f.value), kExact, [=](Ctx& c) { c.out(c.b.fill(f.s, f.dt, f.value)); })
        .zeros_expected = f.value == 0;

  for (DType dt : {F32, BF16}) {
    add_case(t, Op::View, fmt::format("{} input 10 at 3 as 2x3", dn(dt)), kExact, [=](Ctx& c) { c.out(c.b.view(c.rand("x", {10}, dt), 3, {2, 3}, dt)); });
    add_case(t, Op::View, fmt::format("{} input 129 at 128 as 1", dn(dt)), kExact, [=](Ctx& c) { c.out(c.b.view(c.rand("x", {129}, dt), 128, {1}, dt)); });
  }
  add_case(t, Op::View, "f32 computed 12 at 5 as 7, then add", kF32, [](Ctx& c) {
    const ValueId v = c.b.view(c.b.add(c.rand("a", {12}, F32), c.rand("b", {12}, F32)), 5, {7}, F32);
    c.out(c.b.add(v, c.rand("c", {7}, F32)));
    c.out(c.b.view(c.b.add(c.rand("d", {2, 3}, F32), c.rand("e", {2, 3}, F32)), 0, {6}, F32));
  });
}

void backward_gemm_cases(std::vector<OpCase>& t) {
  struct D {
    DType a, b, out;
  };
  const std::vector<D> dts = {{F32, F32, F32}, {BF16, BF16, F32}, {F32, BF16, F32}, {BF16, BF16, BF16}};
  for (const auto& [dys, K] : std::vector<std::pair<Shape, int64_t>>{{{1, 1}, 1}, {{7, 129}, 7}, {{8, 7}, 129}, {{129, 33}, 65}, {{2, 7, 9}, 300}})
    for (const D d : dts)
      add_case(t, Op::MatMulNN, fmt::format("dy {} {} w {} {}x{} -> {}", dn(d.a), dims(dys), dn(d.b), dys.back(), K, dn(d.out)), tol_of(d.out),
               [=, K = K, dys = dys](Ctx& c) { c.out(c.b.matmul_nn(c.rand("dy", dys, d.a), c.rand("w", {dys.back(), K}, d.b), d.out)); });
  for (const bool computed : {false, true})  // + an addend (a gradient sum so far), input or computed (in place)
    add_case(t, Op::MatMulNN, fmt::format("dy bf16 33x16 w 16x40 -> f32 + {} addend", computed ? "computed (in place)" : "input"), kF32, [=](Ctx& c) {
      ValueId addend = c.rand("addend", {33, 40}, F32);
      if (computed) addend = c.b.add(addend, c.rand("addend2", {33, 40}, F32));
      c.out(c.b.matmul_nn(c.rand("dy", {33, 16}, BF16), c.rand("w", {16, 40}, BF16), F32, "", addend));
    });
  for (const auto& [as, bs] : std::vector<std::pair<Shape, Shape>>{{{1, 1}, {1, 1}}, {{7, 7}, {7, 129}}, {{129, 8}, {129, 7}}, {{129, 33}, {129, 65}}, {{2, 5, 129}, {2, 5, 9}}})
    for (const D d : dts)
      add_case(t, Op::MatMulTN, fmt::format("a {} {} b {} {} -> {}", dn(d.a), dims(as), dn(d.b), dims(bs), dn(d.out)), tol_of(d.out),
               [=, as = as, bs = bs](Ctx& c) { c.out(c.b.matmul_tn(c.rand("a", as, d.a), c.rand("b", bs, d.b), d.out)); });
  // LoRA's ΔW_e = B_e·A_e of stacked experts (E slices; r = 1 and 8) and its backward products, every layout.
  for (const auto& [E, M, N, K] : std::vector<std::array<int64_t, 4>>{{1, 1, 1, 1}, {3, 6, 5, 2}, {4, 129, 33, 8}, {2, 7, 65, 129}})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const D d : {D{F32, F32, F32}, D{BF16, BF16, F32}, D{BF16, BF16, BF16}}) {
          const Shape as = ta ? Shape{E, K, M} : Shape{E, M, K}, bs = tb ? Shape{E, N, K} : Shape{E, K, N};
          add_case(t, Op::BatchedMatMul, fmt::format("a {} {}{} b {} {}{} -> {}", dn(d.a), dims(as), ta ? " transposed" : "", dn(d.b), dims(bs), tb ? " transposed" : "", dn(d.out)),
                   tol_of(d.out), [=](Ctx& c) { c.out(c.b.batched_matmul(c.rand("a", as, d.a), c.rand("b", bs, d.b), ta, tb, d.out)); });
        }
  for (const Shape& s : std::vector<Shape>{{1, 1}, {7, 129}, {129, 7}, {3, 5, 33}})
    for (const auto& [in, out] : std::vector<std::pair<DType, DType>>{{F32, F32}, {BF16, F32}, {F32, BF16}})
      add_case(t, Op::SumRows, fmt::format("{} {} -> {}", dn(in), dims(s), dn(out)), tol_of(out), [=, in = in, out = out](Ctx& c) { c.out(c.b.sum_rows(c.rand("x", s, in), out)); });
}

void embedding_backward_cases(std::vector<OpCase>& t) {
  struct S {
    int64_t B, T, V, C;
  };
  for (const S s : {S{1, 1, 1, 1}, S{2, 7, 5, 7}, S{1, 129, 129, 16}, S{2, 7, 4099, 3}})
    for (DType dd : {F32, BF16}) {
      const std::string shape = fmt::format("ids {}x{} V{} dy {} C{}", s.B, s.T, s.V, dn(dd), s.C);
      add_case(t, Op::EmbeddingBackward, shape, kF32, [=](Ctx& c) {
        c.out(c.b.embedding_backward(c.ids("ids", {s.B, s.T}, s.V), c.rand("dy", {s.B, s.T, s.C}, dd), s.V, F32));
      });
      add_case(t, Op::EmbeddingBackward, shape + " base input f32", kF32, [=](Ctx& c) {
        const ValueId ids = c.ids("ids", {s.B, s.T}, s.V), dy = c.rand("dy", {s.B, s.T, s.C}, dd);
        c.out(c.b.embedding_backward(ids, dy, s.V, F32, "", c.rand("base", {s.V, s.C}, F32)));
      });
      // A computed base nothing reads afterwards: the CPU backend scatters into it in place.
      add_case(t, Op::EmbeddingBackward, shape + " base computed (in place)", kF32, [=](Ctx& c) {
        const ValueId ids = c.ids("ids", {s.B, s.T}, s.V), dy = c.rand("dy", {s.B, s.T, s.C}, dd);
        const ValueId base = c.b.add(c.rand("b1", {s.V, s.C}, F32), c.rand("b2", {s.V, s.C}, F32));
        c.out(c.b.embedding_backward(ids, dy, s.V, F32, "", base));
      });
    }
  add_case(t, Op::EmbeddingBackward, "ids 2x7 V5 dy f32 C7 base input bf16", kF32, [](Ctx& c) {
    const ValueId ids = c.ids("ids", {2, 7}, 5), dy = c.rand("dy", {2, 7, 7}, F32);
    c.out(c.b.embedding_backward(ids, dy, 5, F32, "", c.rand("base", {5, 7}, BF16)));
  });
}

void norm_backward_cases(std::vector<OpCase>& t) {
  for (const Shape& xs : std::vector<Shape>{{1, 1}, {7, 7}, {7, 8}, {129, 129}, {2, 3, 64}}) {
    struct D {
      DType x, w, dy;
    };
    for (const D d : {D{F32, F32, F32}, D{BF16, BF16, F32}, D{BF16, F32, BF16}})
      // C = 1: dx = w·dy·inv·eps/(x² + eps) is ~1e-6 of its two terms (w·dy·inv): the error is measured against
      // those terms (floor 1), not against the tiny difference.
      add_case(t, Op::RmsNormBackX, fmt::format("x {} {} w {} dy {}", dn(d.x), dims(xs), dn(d.w), dn(d.dy)), tol_of(d.dy), [=](Ctx& c) {
        c.out(c.b.rms_norm_back_x(c.rand("x", xs, d.x), c.rand("w", {xs.back()}, d.w), c.rand("dy", xs, d.dy), 1e-6));
      }).floor = xs.back() == 1 ? 1.0 : 1e-6;
    for (const auto& [xd, od] : std::vector<std::pair<DType, DType>>{{F32, F32}, {BF16, F32}, {F32, BF16}})
      add_case(t, Op::RmsNormBackW, fmt::format("x {} {} dy f32 -> {}", dn(xd), dims(xs), dn(od)), tol_of(od),
               [=, od = od, xd = xd](Ctx& c) { c.out(c.b.rms_norm_back_w(c.rand("x", xs, xd), c.rand("dy", xs, F32), 1e-6, od)); });
  }
  for (const Shape& s : std::vector<Shape>{{1}, {7}, {3, 129}})
    for (const auto& [gd, dd] : std::vector<std::pair<DType, DType>>{{F32, F32}, {BF16, F32}, {BF16, BF16}})
      add_case(t, Op::SwiGLUBackward, fmt::format("gate/up {} {} dy {}", dn(gd), dims(s), dn(dd)), tol_of(dd), [=, dd = dd, gd = gd](Ctx& c) {
        for (ValueId v : c.b.swiglu_backward(c.rand("gate", s, gd), c.rand("up", s, gd), c.rand("dy", s, dd))) c.out(v);
      });
  add_case(t, Op::SwiGLUBackward, "gate/up f32 129 saturated gates dy f32", kF32, [](Ctx& c) {
    for (ValueId v : c.b.swiglu_backward(c.rand("gate", {129}, F32, 30.0), c.rand("up", {129}, F32), c.rand("dy", {129}, F32))) c.out(v);
  });
  add_case(t, Op::SwiGLUBackward, "gate/up bf16 129 saturated gates dy bf16", kBF16, [](Ctx& c) {
    for (ValueId v : c.b.swiglu_backward(c.rand("gate", {129}, BF16, 30.0), c.rand("up", {129}, BF16), c.rand("dy", {129}, BF16))) c.out(v);
  });
}

void attention_backward_cases(std::vector<OpCase>& t) {
  for (const Att& a : att_shapes()) {
    // (q/k/v, dy): f32; bf16 throughout (bf16 GEMMs); bf16 with an f32 gradient (converted per task).
    for (const auto& [qd, dd] : std::vector<std::pair<DType, DType>>{{F32, F32}, {BF16, BF16}, {BF16, F32}}) {
      const double tol = qd != BF16 ? kF32 : dd == BF16 ? kBF16AttentionBackward : kBF16;
      add_case(t, Op::AttentionBackward, att_name(a, qd, qd) + " dy " + dn(dd), tol, [=, dd = dd, qd = qd](Ctx& c) {
        const ValueId q = c.rand("q", {a.B, a.T, a.H, a.D}, qd), k = c.rand("k", {a.B, a.S, a.Hkv, a.D}, qd), v = c.rand("v", {a.B, a.S, a.Hkv, a.D}, qd);
        const ValueId m = a.mask ? c.segments("mask", a.B, a.S) : kNone;
        const ValueId dy = c.rand("dy", {a.B, a.T, a.H, a.D}, dd);
        for (ValueId g : c.b.attention_backward(q, k, v, m, dy, 1.0 / std::sqrt(static_cast<double>(a.D)), a.causal)) c.out(g);
      });
    }
  }
}

// Targets that hit the last vocabulary row, the first row of the second 4096-column chunk, row 0 and random rows.
std::vector<int32_t> edge_targets(SplitMix64& rng, int64_t R, int64_t V) {
  std::vector<int32_t> t(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t pick[4] = {V - 1, std::min<int64_t>(4096, V - 1), 0, static_cast<int64_t>(rng.next() % static_cast<uint64_t>(V))};
    t[static_cast<size_t>(r)] = static_cast<int32_t>(pick[r % 4]);
  }
  return t;
}

// Targets for token_argmax_match on quarter-valued h, w (exact logits): row 0 aims at a copy of its best vocabulary
// row placed last — a tie the first index wins, so no match — other rows alternate between their argmax (a match)
// and a random token. The logits are rounded to `dt` as the oracle rounds them.
std::vector<int32_t> argmax_targets(Ctx& c, int64_t R, int64_t C, int64_t V, DType dt) {
  Tensor& h = c.data("h");
  Tensor& w = c.data("w");
  auto best = [&](int64_t r) {
    int64_t arg = 0;
    double top = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      double z = 0;
      for (int64_t k = 0; k < C; ++k) z += load_element(h.data(), h.dtype(), r * C + k) * load_element(w.data(), w.dtype(), v * C + k);
      z = dt == BF16 ? round_bf16(static_cast<float>(z)) : static_cast<float>(z);
      if (z > top) top = z, arg = v;
    }
    return arg;
  };
  std::vector<int32_t> t(static_cast<size_t>(R));
  const int64_t a0 = best(0);
  if (V > 1 && a0 != V - 1)
    for (int64_t k = 0; k < C; ++k) store_element(w.mutable_data(), w.dtype(), (V - 1) * C + k, load_element(w.data(), w.dtype(), a0 * C + k));
  t[0] = static_cast<int32_t>(V - 1);
  for (int64_t r = 1; r < R; ++r) t[static_cast<size_t>(r)] = static_cast<int32_t>(r % 2 == 1 ? best(r) : static_cast<int64_t>(c.rng.next() % static_cast<uint64_t>(V)));
  return t;
}

struct Head {
  Shape lead;  // h:[lead..., C]
  int64_t C, V;
};
// Vocabularies of 1, 7, exactly one 4096-column chunk, one chunk and one column, two chunks and a tail.
const std::vector<Head>& head_shapes() {
  static const std::vector<Head> h = {{{1}, 1, 1}, {{7}, 16, 7}, {{7}, 16, 4096}, {{7}, 16, 4097}, {{129}, 8, 4097}, {{3, 5}, 16, 9001}};
  return h;
}

void head_cases(std::vector<OpCase>& t) {
  const size_t first = t.size();
  const std::vector<std::pair<DType, DType>> dts = {{F32, F32}, {BF16, BF16}, {F32, BF16}};
  for (const Head& s : head_shapes()) {
    Shape hs = s.lead;
    hs.push_back(s.C);
    const int64_t R = shape_numel(s.lead);
    for (const auto& [hd, wd] : dts) {
      const std::string shape = fmt::format("h {} {} w {} {}x{}", dn(hd), dims(hs), dn(wd), s.V, s.C);
      const double tol = hd == BF16 ? kBF16 : kF32;
      add_case(t, Op::TokenLogprobs, shape, tol, [=, hd = hd, wd = wd](Ctx& c) {
        const ValueId h = c.rand("h", hs, hd), w = c.rand("w", {s.V, s.C}, wd);
        c.out(c.b.token_logprobs(h, w, c.i32("t", s.lead, edge_targets(c.rng, R, s.V))));
      }).zeros_expected = s.V == 1;  // one token: log p = 0
      add_case(t, Op::Entropy, shape, tol, [=, hd = hd, wd = wd](Ctx& c) { c.out(c.b.entropy(c.rand("h", hs, hd), c.rand("w", {s.V, s.C}, wd))); }).zeros_expected = s.V == 1;
      add_case(t, Op::TokenArgmaxMatch, shape + " quarters", kExact, [=, hd = hd, wd = wd](Ctx& c) {
        const ValueId h = c.quarters("h", hs, hd), w = c.quarters("w", {s.V, s.C}, wd);
        c.out(c.b.token_argmax_match(h, w, c.i32("t", s.lead, argmax_targets(c, R, s.C, s.V, hd))));
      });
      if (s.C == 1) continue;
      auto dlogp = [R](Ctx& c, const Shape& lead) {  // every third row has no gradient
        std::vector<double> g(static_cast<size_t>(R));
        for (int64_t r = 0; r < R; ++r) g[static_cast<size_t>(r)] = r % 3 == 2 ? 0.0 : c.rng.normal();
        return c.vals("dlogp", lead, F32, g);
      };
      add_case(t, Op::TokenLogprobsBackward, shape + " dlogp f32", tol, [=, hd = hd, wd = wd](Ctx& c) {
        const ValueId h = c.rand("h", hs, hd), w = c.rand("w", {s.V, s.C}, wd), tg = c.i32("t", s.lead, edge_targets(c.rng, R, s.V));
        for (ValueId v : c.b.token_logprobs_backward(h, w, tg, dlogp(c, s.lead))) c.out(v);
      });
      add_case(t, Op::EntropyBackward, shape + " dH f32", tol, [=, hd = hd, wd = wd](Ctx& c) {
        const ValueId h = c.rand("h", hs, hd), w = c.rand("w", {s.V, s.C}, wd);
        for (ValueId v : c.b.entropy_backward(h, w, dlogp(c, s.lead))) c.out(v);
      });
    }
  }
  // Large logits (h scaled by 4: logits of std ~16): the running max and log-sum-exp across chunks.
  for (DType dt : {F32, BF16}) {
    const double tol = tol_of(dt);
    add_case(t, Op::TokenLogprobs, fmt::format("h {} 7x16 x4 w {} 4097x16 large logits", dn(dt), dn(dt)), tol, [=](Ctx& c) {
      const ValueId h = c.rand("h", {7, 16}, dt, 4.0), w = c.rand("w", {4097, 16}, dt);
      c.out(c.b.token_logprobs(h, w, c.i32("t", {7}, edge_targets(c.rng, 7, 4097))));
    });
    add_case(t, Op::Entropy, fmt::format("h {} 7x16 x4 w {} 4097x16 large logits", dn(dt), dn(dt)), tol,
             [=](Ctx& c) { c.out(c.b.entropy(c.rand("h", {7, 16}, dt, 4.0), c.rand("w", {4097, 16}, dt))); });
  }
  // The forward ops and both backward ops on the same (h, w, targets) in one graph: the CPU backend shares one
  // pass over the vocabulary between them (and, in bf16, keeps the logits for the backward ops).
  for (DType dt : {F32, BF16})
    for (bool entropy_first : {false, true})
      add_case(t, entropy_first ? Op::EntropyBackward : Op::TokenLogprobsBackward,
               fmt::format("{} h 2x5x16 w 4097x16 fused with the forward ops{}", dn(dt), entropy_first ? ", entropy first" : ""), tol_of(dt), [=](Ctx& c) {
                 const ValueId h = c.rand("h", {2, 5, 16}, dt), w = c.rand("w", {4097, 16}, dt), tg = c.i32("t", {2, 5}, edge_targets(c.rng, 10, 4097));
                 const ValueId dl = c.rand("dlogp", {2, 5}, F32), de = c.rand("dH", {2, 5}, F32);
                 const ValueId e = entropy_first ? c.b.entropy(h, w) : kNone;
                 c.out(c.b.token_logprobs(h, w, tg));
                 c.out(c.b.token_argmax_match(h, w, tg));
                 c.out(entropy_first ? e : c.b.entropy(h, w));
                 for (ValueId v : c.b.token_logprobs_backward(h, w, tg, dl)) c.out(v);
                 for (ValueId v : c.b.entropy_backward(h, w, de)) c.out(v);
               });
  // The ops above also run unfused (a graph compiled without fuse_vocabulary_ops): each op's own lowering.
  for (size_t i = first; i < t.size(); ++i) t[i].unfused = true;
  // vocab_stats itself, every row, with and without targets and entropy. Quarter inputs make the logits exact, so
  // the match row is compared exactly too (up to the f32 exp of logp, H and lse).
  using graph::VocabStat;
  for (const Head& s : head_shapes()) {
    Shape hs = s.lead;
    hs.push_back(s.C);
    const int64_t R = shape_numel(s.lead);
    for (const auto& [hd, wd] : dts)
      for (const auto& [with_targets, with_entropy] : {std::pair{true, true}, {false, true}, {true, false}}) {
        const std::string shape = fmt::format("h {} {} w {} {}x{}{}{}", dn(hd), dims(hs), dn(wd), s.V, s.C, with_targets ? " targets" : "",
                                              with_entropy ? " entropy" : "");
        add_case(t, Op::VocabStats, shape + " quarters", kF32, [=, hd = hd, wd = wd, with_entropy = with_entropy, with_targets = with_targets](Ctx& c) {
          const ValueId h = c.quarters("h", hs, hd), w = c.quarters("w", {s.V, s.C}, wd);
          const ValueId tg = with_targets ? c.i32("t", s.lead, argmax_targets(c, R, s.C, s.V, hd)) : kNone;
          const ValueId st = c.b.vocab_stats(h, w, tg, with_entropy, false);
          for (VocabStat k : {VocabStat::Logprob, VocabStat::Entropy, VocabStat::Match, VocabStat::Lse}) c.out(c.b.vocab_stat(st, k));
        }).zeros_expected = s.V == 1;
      }
  }
  // Backward nodes reading a vocab_stats node (in bf16 also its kept logits) instead of recomputing the pass.
  for (DType dt : {F32, BF16})
    for (bool keep : {false, true}) {
      if (keep && dt != BF16) continue;
      add_case(t, Op::TokenLogprobsBackward, fmt::format("{} h 2x5x16 w 4097x16 reading vocab_stats{}", dn(dt), keep ? " and its kept logits" : ""),
               tol_of(dt), [=](Ctx& c) {
                 const ValueId h = c.rand("h", {2, 5, 16}, dt), w = c.rand("w", {4097, 16}, dt), tg = c.i32("t", {2, 5}, edge_targets(c.rng, 10, 4097));
                 const ValueId dl = c.rand("dlogp", {2, 5}, F32), de = c.rand("dH", {2, 5}, F32);
                 const ValueId st = c.b.vocab_stats(h, w, tg, true, keep);
                 c.out(c.b.vocab_stat(st, VocabStat::Logprob));
                 for (ValueId v : c.b.token_logprobs_backward(h, w, tg, dl, "", st)) c.out(v);
                 for (ValueId v : c.b.entropy_backward(h, w, de, "", st)) c.out(v);
               });
    }
}

// The generalized JSD of a student head (h, w) and a teacher head (ht, wt) of another width and dtype: β 0 (forward
// KL), 1 (reverse KL) and in between (the mixture's second pass); every vocabulary size of head_shapes(); the
// backward reading the jsd node, with and without dw (a frozen head). Teacher logits of a larger scale make the
// two distributions differ (a KL of order 1).
void jsd_cases(std::vector<OpCase>& t) {
  const std::vector<std::pair<DType, DType>> dts = {{F32, F32}, {BF16, BF16}, {BF16, F32}};
  for (const Head& s : head_shapes()) {
    if (s.C == 1) continue;
    Shape hs = s.lead, ts = s.lead;
    hs.push_back(s.C), ts.push_back(s.C / 2 + 3);
    const int64_t R = shape_numel(s.lead), Ct = ts.back();
    for (const auto& [sd, td] : dts)
      for (double beta : {0.0, 0.5, 1.0, 0.9}) {
        const std::string shape =
            fmt::format("student {} {} w {}x{} teacher {} {} beta {}", dn(sd), dims(hs), s.V, s.C, dn(td), dims(ts), beta);
        const double tol = sd == BF16 || td == BF16 ? kBF16 : kF32;
        auto heads = [=, sd = sd, td = td](Ctx& c) {
          return std::array<ValueId, 4>{c.rand("h", hs, sd), c.rand("w", {s.V, s.C}, sd), c.rand("ht", ts, td, 2.0), c.rand("wt", {s.V, Ct}, td)};
        };
        add_case(t, Op::Jsd, shape, tol, [=](Ctx& c) {
          const auto [h, w, ht, wt] = heads(c);
          c.out(c.b.jsd(h, w, ht, wt, beta));
        }).zeros_expected = s.V == 1;
        // In f32 the mixture's gradient is a small difference of O(1) terms (dz = (1 − β)·S·(log S/M − KL(S‖M)),
        // summed over V with random signs): the f32 logits' own rounding leaves 1-2e-5 of the gradient's scale.
        const double btol = tol == kF32 && beta != 0 && beta != 1 ? 3 * kF32 : tol;
        for (bool with_dw : {true, false})
          add_case(t, Op::JsdBackward, shape + (with_dw ? "" : " dh only"), btol, [=](Ctx& c) {
            const auto [h, w, ht, wt] = heads(c);
            const ValueId value = c.b.jsd(h, w, ht, wt, beta);
            std::vector<double> g(static_cast<size_t>(R));
            for (int64_t r = 0; r < R; ++r) g[static_cast<size_t>(r)] = r % 3 == 2 ? 0.0 : c.rng.normal();
            c.out(value);
            for (ValueId v : c.b.jsd_backward(h, w, ht, wt, c.vals("djsd", s.lead, F32, g), c.b.node(value).inputs[0], "", with_dw))
              if (v != kNone) c.out(v);
          });
      }
  }
}

std::string param_name(const std::string& op, const std::string& name) {
  std::string s = op + "_";
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
    if (ok) s += ch;
    else if (ch == '-') s += "_";  // "->" reads as "__"
    else if (!s.empty() && s.back() != '_') s += '_';
  }
  while (!s.empty() && s.back() == '_') s.pop_back();
  return s;
}

// Gives cases whose gtest names would collide a numeric suffix (gtest aborts on duplicate parameter names).
void make_names_unique(std::vector<OpCase>& t) {
  std::map<std::string, int> seen;
  for (OpCase& c : t)
    if (const int n = seen[param_name(graph::op_name(c.op), c.name)]++; n > 0) c.name += fmt::format(" #{}", n + 1);
}

// Mixture of experts. The experts' rows per expert cross the CPU backend's GEMM chunks (128/64/32/16 rows) and its
// dot-product path below 16 rows; E = 8 with tokens routed to 4 of them leaves experts without a token; a row may
// choose an expert twice (random ids), which the op allows.
struct MoeShape {
  int64_t N, C, F, E, K;
};
std::string moe_dims(const MoeShape& s) { return fmt::format("N{} C{} F{} E{} K{}", s.N, s.C, s.F, s.E, s.K); }
// Router logits [N, E] and their top-k experts.
std::pair<ValueId, ValueId> moe_router(Ctx& c, const MoeShape& s, DType dt) {
  const ValueId logits = c.rand("logits", {s.N, s.E}, dt);
  return {logits, c.b.moe_topk(logits, s.K)};
}

void moe_cases(std::vector<OpCase>& t) {
  for (DType dt : {F32, BF16}) {
    for (const MoeShape s : {MoeShape{1, 1, 1, 1, 1}, MoeShape{7, 8, 6, 4, 2}, MoeShape{129, 16, 12, 128, 8}, MoeShape{5, 4, 3, 4, 4}})
      add_case(t, Op::MoeTopK, fmt::format("logits {} {}x{} k {}", dn(dt), s.N, s.E, s.K), kExact, [=](Ctx& c) { c.out(moe_router(c, s, dt).second); })
          .zeros_expected = true;
    // Quarters: many equal logits, so the ties go to the lower index everywhere.
    add_case(t, Op::MoeTopK, fmt::format("logits {} 33x16 k 4 with ties", dn(dt)), kExact,
             [=](Ctx& c) { c.out(c.b.moe_topk(c.quarters("logits", {33, 16}, dt), 4)); });
    for (bool norm : {false, true})
      for (const MoeShape s : {MoeShape{1, 1, 1, 1, 1}, MoeShape{9, 1, 1, 6, 3}, MoeShape{129, 1, 1, 128, 8}})
        add_case(t, Op::MoeRouteWeights, fmt::format("logits {} {}x{} k {}{}", dn(dt), s.N, s.E, s.K, norm ? " normalized" : ""), kF32, [=](Ctx& c) {
          const auto [logits, experts] = moe_router(c, s, dt);
          c.out(c.b.moe_route_weights(logits, experts, norm));
        });
    for (const MoeShape s : {MoeShape{1, 1, 1, 1, 1}, MoeShape{7, 8, 6, 4, 2}, MoeShape{1, 48, 40, 16, 8}, MoeShape{129, 16, 12, 16, 8},
                             MoeShape{300, 16, 8, 2, 2}, MoeShape{40, 24, 20, 8, 2}})
      add_case(t, Op::MoeExperts, fmt::format("{} {}", dn(dt), moe_dims(s)), tol_of(dt), [=](Ctx& c) {
        const auto [logits, experts] = moe_router(c, s, dt);
        const ValueId w = c.b.cast(c.b.moe_route_weights(logits, experts, true), dt);
        c.out(c.b.moe_experts(c.rand("x", {s.N, s.C}, dt), experts, w, c.rand("gate_up", {s.E, 2 * s.F, s.C}, dt, 0.3),
                              c.rand("down", {s.E, s.C, s.F}, dt, 0.3)));
      });
    // Expert parallel: this rank's experts [first, first + local) of s.E; the other choices add nothing.
    for (const auto& [s, first, local] : std::vector<std::tuple<MoeShape, int64_t, int64_t>>{{MoeShape{129, 16, 12, 16, 8}, 8, 4},
                                                                                            {MoeShape{1, 48, 40, 16, 8}, 12, 4},
                                                                                            {MoeShape{300, 16, 8, 4, 2}, 0, 2}})
      add_case(t, Op::MoeExperts, fmt::format("{} {}, experts [{}, {}) here", dn(dt), moe_dims(s), first, first + local), tol_of(dt),
               [=, s = s, first = first, local = local](Ctx& c) {
        const auto [logits, experts] = moe_router(c, s, dt);
        const ValueId w = c.b.cast(c.b.moe_route_weights(logits, experts, true), dt);
        c.out(c.b.moe_experts(c.rand("x", {s.N, s.C}, dt), experts, w, c.rand("gate_up", {local, 2 * s.F, s.C}, dt, 0.3),
                              c.rand("down", {local, s.C, s.F}, dt, 0.3), "", first, s.E));
      });
    add_case(t, Op::MoeExperts, fmt::format("{} N40 C24 F20 E8 K2, 4 experts without a token, repeated choices", dn(dt)), tol_of(dt), [=](Ctx& c) {
      c.out(c.b.moe_experts(c.rand("x", {40, 24}, dt), c.ids("experts", {40, 2}, 4), c.rand("w", {40, 2}, F32), c.rand("gate_up", {8, 40, 24}, dt, 0.3),
                            c.rand("down", {8, 24, 20}, dt, 0.3)));
    });
    for (bool masked : {false, true})
      add_case(t, Op::MoeRouterStats, fmt::format("logits {} 129x16 k 4{}", dn(dt), masked ? " masked" : ""), kF32, [=](Ctx& c) {
        const auto [logits, experts] = moe_router(c, MoeShape{129, 1, 1, 16, 4}, dt);
        c.out(c.b.moe_router_stats(logits, experts, masked ? c.ids("mask", {129}, 3) : kNone));
      });
    add_case(t, Op::MoeAuxLoss, fmt::format("two layers' stats, logits {} 33x8 k 2 masked", dn(dt)), kF32, [=](Ctx& c) {
      const ValueId mask = c.ids("mask", {33}, 2);
      ValueId sum = kNone;
      for (int layer = 0; layer < 2; ++layer) {
        const ValueId logits = c.rand(fmt::format("logits{}", layer), {33, 8}, dt);
        const ValueId st = c.b.moe_router_stats(logits, c.b.moe_topk(logits, 2), mask);
        sum = sum == kNone ? st : c.b.add(sum, st);
      }
      c.out(c.b.moe_aux_loss(sum));
    });
  }
  // The backward ops on their own (the VJP cases below also run them through autodiff).
  for (DType dt : {F32, BF16})
    for (bool norm : {false, true})
      add_case(t, Op::MoeRouteWeightsBackward, fmt::format("logits {} 33x16 k 4{}", dn(dt), norm ? " normalized" : ""), kF32, [=](Ctx& c) {
        const auto [logits, experts] = moe_router(c, MoeShape{33, 1, 1, 16, 4}, dt);
        c.out(c.b.moe_route_weights_backward(logits, experts, c.rand("dw", {33, 4}, F32), norm));
      });
  for (DType dt : {F32, BF16})
    for (const MoeShape s : {MoeShape{7, 8, 6, 4, 2}, MoeShape{129, 16, 12, 16, 8}, MoeShape{300, 16, 8, 2, 2}})
      for (bool frozen : {false, true})
        add_case(t, Op::MoeExpertsBackward, fmt::format("{} {} dy f32{}", dn(dt), moe_dims(s), frozen ? ", frozen experts" : ""), tol_of(dt), [=](Ctx& c) {
          const auto [logits, experts] = moe_router(c, s, dt);
          const ValueId w = c.b.cast(c.b.moe_route_weights(logits, experts, true), dt);
          for (ValueId v : c.b.moe_experts_backward(c.rand("x", {s.N, s.C}, dt), experts, w, c.rand("gate_up", {s.E, 2 * s.F, s.C}, dt, 0.3),
                                                    c.rand("down", {s.E, s.C, s.F}, dt, 0.3), c.rand("dy", {s.N, s.C}, F32), "d", !frozen))
            if (v != kNone) c.out(v);
        });
  for (DType dt : {F32, BF16})
    for (bool frozen : {false, true})
      add_case(t, Op::MoeExpertsBackward, fmt::format("{} N129 C16 F12 E16 K8, experts [4, 8) here, dy f32{}", dn(dt), frozen ? ", frozen experts" : ""),
               tol_of(dt), [=](Ctx& c) {
                 const MoeShape s{129, 16, 12, 16, 8};
                 const auto [logits, experts] = moe_router(c, s, dt);
                 const ValueId w = c.b.cast(c.b.moe_route_weights(logits, experts, true), dt);
                 for (ValueId v : c.b.moe_experts_backward(c.rand("x", {s.N, s.C}, dt), experts, w, c.rand("gate_up", {4, 2 * s.F, s.C}, dt, 0.3),
                                                           c.rand("down", {4, s.C, s.F}, dt, 0.3), c.rand("dy", {s.N, s.C}, F32), "d", !frozen, 4, s.E))
                   if (v != kNone) c.out(v);
               });
  for (DType dt : {F32, BF16})
    add_case(t, Op::MoeRouterStatsBackward, fmt::format("logits {} 65x8 masked", dn(dt)), kF32, [=](Ctx& c) {
      c.out(c.b.moe_router_stats_backward(c.rand("logits", {65, 8}, dt), c.ids("mask", {65}, 2), c.rand("ds", {17}, F32)));
    });
  add_case(t, Op::MoeAuxLossBackward, "stats 2x8+1", kF32, [](Ctx& c) {
    c.out(c.b.moe_aux_loss_backward(c.vals("stats", {17}, F32, {3, 1, 0, 2, 4, 1, 0, 5, 2.5, 0.5, 1, 1, 2, 0.25, 0.75, 1.5, 8}), c.rand("g", {}, F32)));
  });
}

const std::vector<OpCase>& op_table() {
  static const std::vector<OpCase> table = [] {
    std::vector<OpCase> t;
    embedding_cases(t);
    matmul_cases(t);
    rms_norm_cases(t);
    rope_cases(t);
    attention_cases(t);
    elementwise_cases(t);
    data_movement_cases(t);
    backward_gemm_cases(t);
    embedding_backward_cases(t);
    norm_backward_cases(t);
    attention_backward_cases(t);
    head_cases(t);
    jsd_cases(t);
    collective_cases(t);
    moe_cases(t);
    make_names_unique(t);
    return t;
  }();
  return table;
}

// ---- every op has cases ----

std::vector<Op> all_ops() {  // every enumerator but Input: the values op_name knows
  std::vector<Op> ops;
  for (int i = 0; i < 256; ++i) {
    const Op op = static_cast<Op>(i);
    if (op != Op::Input && std::string(graph::op_name(op)) != "?") ops.push_back(op);
  }
  return ops;
}

TEST(OpTable, EveryOpHasCases) {
  std::map<Op, int> count;
  for (const OpCase& c : op_table()) ++count[c.op];
  const std::vector<Op> ops = all_ops();
  EXPECT_GE(ops.size(), static_cast<size_t>(Op::View));  // op_name knows every enumerator up to View at least
  for (Op op : ops) EXPECT_GE(count[op], 1) << "op " << graph::op_name(op) << " has no case in the op table (tests/backend/op_table_test.cpp)";
  for (const OpCase& c : op_table()) EXPECT_FALSE(param_name(graph::op_name(c.op), c.name).empty());
}

class OpTableCase : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpTableCase, MatchesReference) { check_case(GetParam(), backends_under_test()); }

INSTANTIATE_TEST_SUITE_P(OpTable, OpTableCase, ::testing::ValuesIn(op_table()),
                         [](const ::testing::TestParamInfo<OpCase>& p) { return param_name(graph::op_name(p.param.op), p.param.name); });

// ---- the compare helper and check_case fail on what they must ----

TEST(OpTableCompare, FailsOnAPlantedNaNOrInf) {
  const std::vector<double> want = {1.0, -2.0, 3.0, 0.5};
  EXPECT_TRUE(compare(want, want, 0).ok);
  for (double bad : {static_cast<double>(NAN), static_cast<double>(INFINITY), -static_cast<double>(INFINITY)})
    for (size_t i = 0; i < want.size(); ++i) {
      std::vector<double> got = want;
      got[i] = bad;
      const Comparison c = compare(want, got, 1e30);  // no tolerance lets a non-finite value pass
      EXPECT_FALSE(c.ok) << "planted " << bad << " at " << i;
      EXPECT_EQ(c.index, static_cast<int64_t>(i));
      EXPECT_NE(c.problem.find("not finite"), std::string::npos) << c.problem;
    }
}

TEST(OpTableCompare, FailsOnANonFiniteReferenceUnlessExpected) {
  const std::vector<double> want = {1.0, static_cast<double>(NAN), static_cast<double>(INFINITY)};
  const Comparison c = compare(want, want, 1e30);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.index, 1);
  EXPECT_NE(c.problem.find("reference itself"), std::string::npos) << c.problem;
  EXPECT_TRUE(compare(want, want, 0, /*nonfinite_expected=*/true).ok);
  EXPECT_FALSE(compare(want, {1.0, 0.0, static_cast<double>(INFINITY)}, 1e30, true).ok);                          // NaN lost
  EXPECT_FALSE(compare(want, {1.0, static_cast<double>(NAN), -static_cast<double>(INFINITY)}, 1e30, true).ok);   // wrong sign
  EXPECT_FALSE(compare(want, {1.0, static_cast<double>(NAN), static_cast<double>(NAN)}, 1e30, true).ok);         // Inf became NaN
}

TEST(OpTableCompare, ReportsTheWorstElementAgainstTheLargestValue) {
  const std::vector<double> want = {1.0, -4.0, 2.0, 0.0};
  const std::vector<double> got = {1.001, -4.0, 2.02, 0.0};
  const Comparison c = compare(want, got, 1e-2);
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.index, 2);
  EXPECT_DOUBLE_EQ(c.scale, 4.0);
  EXPECT_NEAR(c.error, 0.02 / 4.0, 1e-12);
  EXPECT_FALSE(compare(want, got, 1e-3).ok);
  EXPECT_FALSE(compare(want, {1.0, -4.0, 2.0}, 1.0).ok);  // a missing value
  EXPECT_TRUE(compare({}, {}, 0).ok);
  EXPECT_FALSE(compare({0.0, 0.0}, {0.0, 1e-3}, 1e-2).ok);  // all-zero reference: the floor (1e-6) is the scale
}

// A backend that runs the reference and then spoils its results (or inputs), to prove that check_case notices.
class SpoilingBackend final : public Backend {
 public:
  using Spoil = std::function<void(std::vector<Tensor>&, const TensorMap&)>;
  explicit SpoilingBackend(Spoil spoil) : spoil_(std::move(spoil)) {}
  std::string name() const override { return "spoiling"; }
  std::unique_ptr<Program> compile(const graph::Graph& g) override {
    struct P final : Program {
      std::unique_ptr<Program> inner;
      Spoil spoil;
      std::vector<Tensor> run(const TensorMap& in) override {
        std::vector<Tensor> out;
        for (const Tensor& t : inner->run(in)) out.push_back(t.clone());
        spoil(out, in);
        return out;
      }
    };
    auto p = std::make_unique<P>();
    p->inner = make_reference_backend()->compile(g);
    p->spoil = spoil_;
    return p;
  }

 private:
  Spoil spoil_;
};

std::vector<std::string> failures_of(const std::function<void()>& f) {
  ::testing::TestPartResultArray results;
  {
    const ::testing::ScopedFakeTestPartResultReporter reporter(::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    f();
  }
  std::vector<std::string> out;
  for (int i = 0; i < results.size(); ++i)
    if (results.GetTestPartResult(i).failed()) out.push_back(results.GetTestPartResult(i).message());
  return out;
}

TEST(OpTableCompare, CheckCaseFailsOnASpoiledBackend) {
  OpCase c;
  c.op = Op::Add;
  c.name = "f32 7 (self-test)";
  c.tol = kF32;
  c.build = [](Ctx& x) { x.out(x.b.add(x.rand("a", {7}, F32), x.rand("b", {7}, F32))); };
  auto backend = [](SpoilingBackend::Spoil s) -> Backends { return {{"spoiling", [s] { return std::make_unique<SpoilingBackend>(s); }}}; };
  auto set = [](Tensor& t, int64_t i, double v) { store_element(t.mutable_data(), t.dtype(), i, v); };

  EXPECT_TRUE(failures_of([&] { check_case(c, backend([](std::vector<Tensor>&, const TensorMap&) {})); }).empty());
  const struct {
    const char* what;
    SpoilingBackend::Spoil spoil;
    const char* message;
  } spoils[] = {
      {"NaN", [&](std::vector<Tensor>& o, const TensorMap&) { set(o[0], 3, NAN); }, "not finite"},
      {"Inf", [&](std::vector<Tensor>& o, const TensorMap&) { set(o[0], 6, INFINITY); }, "not finite"},
      {"off by 1e-3", [&](std::vector<Tensor>& o, const TensorMap&) { set(o[0], 0, load_element(o[0].data(), F32, 0) + 1e-3); }, "above tolerance"},
      {"input modified", [&](std::vector<Tensor>&, const TensorMap& in) {
         Tensor a = in.at("a");  // shares the bound storage
         set(a, 0, 42.0);
       }, "modified input 'a'"},
      {"wrong shape", [](std::vector<Tensor>& o, const TensorMap&) { o[0] = o[0].reshape({7, 1}); }, "got [7, 1]"},
      {"throws", [](std::vector<Tensor>&, const TensorMap&) { fail("kernel exploded"); }, "kernel exploded"},
  };
  for (const auto& s : spoils) {
    const std::vector<std::string> f = failures_of([&] { check_case(c, backend(s.spoil)); });
    ASSERT_FALSE(f.empty()) << s.what << ": check_case passed";
    EXPECT_NE(f[0].find(s.message), std::string::npos) << s.what << ": " << f[0];
    EXPECT_NE(f[0].find("op add, case 'f32 7 (self-test)', backend spoiling"), std::string::npos) << f[0];
  }
  // A degenerate case (an all-zero reference output) fails unless declared.
  OpCase zero = c;
  zero.build = [](Ctx& x) { x.out(x.b.add(x.vals("a", {2}, F32, {0, 0}), x.vals("b", {2}, F32, {0, 0}))); };
  EXPECT_FALSE(failures_of([&] { check_case(zero, {}); }).empty());
  zero.zeros_expected = true;
  EXPECT_TRUE(failures_of([&] { check_case(zero, {}); }).empty());
}

// ---- VJPs: each backward op against finite differences of its forward op, on the reference ----

struct VjpCase {
  Op op;  // the forward op
  std::string name;
  std::vector<std::string> wrt;
  std::vector<Op> backward_ops;  // ops the backward graph must contain (after the loss)
  std::function<ValueId(Ctx&, DType)> forward;  // declares its inputs (floats in the given dtype)
};

void PrintTo(const VjpCase& v, std::ostream* os) { *os << graph::op_name(v.op) << " " << v.name; }

const std::vector<VjpCase>& vjp_table() {
  static const std::vector<VjpCase> t = {
      {Op::MatMul, "x 3x5x7 w 6x7 bias", {"x", "w", "b"}, {Op::MatMulNN, Op::MatMulTN, Op::SumRows},
       [](Ctx& c, DType dt) { return c.b.matmul(c.rand("x", {3, 5, 7}, dt), c.rand("w", {6, 7}, dt), c.rand("b", {6}, dt), dt); }},
      {Op::MatMul, "x 2x7 w 9x7 (GEMV rows)", {"x", "w"}, {Op::MatMulNN, Op::MatMulTN},
       [](Ctx& c, DType dt) { return c.b.matmul(c.rand("x", {2, 7}, dt), c.rand("w", {9, 7}, dt), kNone, dt); }},
      // LoRA's shape: y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ with the branch accumulated into the base output; x's two gradients
      // are summed by the second dx GEMM (autodiff folds the sum into its addend).
      {Op::MatMul, "x 4x7 W 6x7 A 2x7 B 6x2, B's GEMM adds into x·Wᵀ", {"x", "A", "B"}, {Op::MatMulNN, Op::MatMulTN},
       [](Ctx& c, DType dt) {
         const ValueId x = c.rand("x", {4, 7}, dt);
         const ValueId base = c.b.matmul(x, c.rand("W", {6, 7}, dt), kNone, dt);
         return c.b.matmul(c.b.matmul(x, c.rand("A", {2, 7}, dt), kNone, dt), c.rand("B", {6, 2}, dt), kNone, dt, "", base);
       }},
      {Op::RmsNorm, "x 4x7 w 7", {"x", "w"}, {Op::RmsNormBackX, Op::RmsNormBackW},
       [](Ctx& c, DType dt) { return c.b.rms_norm(c.rand("x", {4, 7}, dt), c.rand("w", {7}, dt), 1e-6); }},
      {Op::Rope, "x 2x3x2x8", {"x"}, {Op::Rope},
       [](Ctx& c, DType dt) { return c.b.rope(c.rand("x", {2, 3, 2, 8}, dt), c.ids("pos", {2, 3}, 50), {1.0f, 0.1f, 0.01f, 0.001f}, 1.0f); }},
      {Op::SwiGLU, "gate/up 3x6", {"gate", "up"}, {Op::SwiGLUBackward, Op::View},
       [](Ctx& c, DType dt) { return c.b.swiglu(c.rand("gate", {3, 6}, dt), c.rand("up", {3, 6}, dt)); }},
      {Op::Attention, "q 2x3x4x8 kv S5 Hkv2 segments causal", {"q", "k", "v"}, {Op::AttentionBackward, Op::View},
       [](Ctx& c, DType dt) {
         const ValueId q = c.rand("q", {2, 3, 4, 8}, dt), k = c.rand("k", {2, 5, 2, 8}, dt), v = c.rand("v", {2, 5, 2, 8}, dt);
         return c.b.attention(q, k, v, c.segments("mask", 2, 5), 0.35, true);
       }},
      {Op::Attention, "q 1x7x2x4 kv S7 Hkv1 non-causal", {"q", "k", "v"}, {Op::AttentionBackward},
       [](Ctx& c, DType dt) {
         const ValueId q = c.rand("q", {1, 7, 2, 4}, dt), k = c.rand("k", {1, 7, 1, 4}, dt), v = c.rand("v", {1, 7, 1, 4}, dt);
         return c.b.attention(q, k, v, kNone, 0.5, false);
       }},
      {Op::TokenLogprobs, "h 2x3x4 w 9x4", {"h", "w"}, {Op::TokenLogprobsBackward, Op::View},
       [](Ctx& c, DType dt) { return c.b.token_logprobs(c.rand("h", {2, 3, 4}, dt), c.rand("w", {9, 4}, dt), c.ids("t", {2, 3}, 9)); }},
      {Op::Entropy, "h 2x3x4 w 9x4", {"h", "w"}, {Op::EntropyBackward, Op::View},
       [](Ctx& c, DType dt) { return c.b.entropy(c.rand("h", {2, 3, 4}, dt), c.rand("w", {9, 4}, dt)); }},
      // A frozen head (LoRA): the backward nodes compute dh alone (attrs.dh_only).
      {Op::TokenLogprobs, "frozen head: h 2x3x4 w 9x4, dh only", {"h"}, {Op::TokenLogprobsBackward, Op::View},
       [](Ctx& c, DType dt) { return c.b.token_logprobs(c.rand("h", {2, 3, 4}, dt), c.rand("w", {9, 4}, dt), c.ids("t", {2, 3}, 9)); }},
      {Op::Entropy, "frozen head: h 2x3x4 w 9x4, dh only", {"h"}, {Op::EntropyBackward, Op::View},
       [](Ctx& c, DType dt) { return c.b.entropy(c.rand("h", {2, 3, 4}, dt), c.rand("w", {9, 4}, dt)); }},
      // Distillation: the student's gradients of the generalized JSD (the teacher, of another width, is frozen).
      {Op::Jsd, "beta 0 h 2x3x4 w 9x4 teacher 2x3x5 9x5", {"h", "w"}, {Op::JsdBackward, Op::View},
       [](Ctx& c, DType dt) { return c.b.jsd(c.rand("h", {2, 3, 4}, dt), c.rand("w", {9, 4}, dt), c.rand("ht", {2, 3, 5}, dt), c.rand("wt", {9, 5}, dt), 0.0); }},
      {Op::Jsd, "beta 1 h 2x3x4 w 9x4 teacher 2x3x5 9x5", {"h", "w"}, {Op::JsdBackward, Op::View},
       [](Ctx& c, DType dt) { return c.b.jsd(c.rand("h", {2, 3, 4}, dt), c.rand("w", {9, 4}, dt), c.rand("ht", {2, 3, 5}, dt), c.rand("wt", {9, 5}, dt), 1.0); }},
      {Op::Jsd, "beta 0.5 h 2x3x4 w 9x4 teacher 2x3x5 9x5", {"h", "w"}, {Op::JsdBackward, Op::View},
       [](Ctx& c, DType dt) { return c.b.jsd(c.rand("h", {2, 3, 4}, dt), c.rand("w", {9, 4}, dt), c.rand("ht", {2, 3, 5}, dt), c.rand("wt", {9, 5}, dt), 0.5); }},
      {Op::Jsd, "frozen head: beta 0.2 h 2x3x4 w 9x4 teacher 2x3x5 9x5, dh only", {"h"}, {Op::JsdBackward, Op::View},
       [](Ctx& c, DType dt) { return c.b.jsd(c.rand("h", {2, 3, 4}, dt), c.rand("w", {9, 4}, dt), c.rand("ht", {2, 3, 5}, dt), c.rand("wt", {9, 5}, dt), 0.2); }},
      {Op::Embedding, "ids 2x3 table 7x4", {"table"}, {Op::EmbeddingBackward},
       [](Ctx& c, DType dt) { return c.b.embedding(c.ids("ids", {2, 3}, 7), c.rand("table", {7, 4}, dt), dt); }},
      {Op::Embedding, "tied: ids 2x3 table 6x4 also the head of token_logprobs (base)", {"table"}, {Op::EmbeddingBackward, Op::TokenLogprobsBackward},
       [](Ctx& c, DType dt) {
         const ValueId table = c.rand("table", {6, 4}, dt);
         const ValueId h = c.b.embedding(c.ids("ids", {2, 3}, 6), table, dt);
         return c.b.token_logprobs(h, table, c.ids("t", {2, 3}, 6));
       }},
      {Op::Dropout, "x 3x41 p 0.3", {"x"}, {Op::Dropout},
       [](Ctx& c, DType dt) { return c.b.dropout(c.rand("x", {3, 41}, dt), c.i32("seed", {2}, {5, 6}), 0.3, 11); }},
      // Mixture of experts: the router's weights (a chosen subset of a softmax, renormalized or not), the experts
      // (every input but the choice of experts, which has no gradient; frozen: x and the routing weights only), and
      // the load-balancing loss through the router's probabilities.
      // LoRA on stacked experts: W + B_e·A_e (the form the model builds), then every layout of the op's own rule.
      {Op::BatchedMatMul, "W 3x6x5 + B 3x6x2 · A 3x2x5", {"A", "B"}, {Op::BatchedMatMul},
       [](Ctx& c, DType dt) { return c.b.add(c.rand("W", {3, 6, 5}, dt), c.b.batched_matmul(c.rand("B", {3, 6, 2}, dt), c.rand("A", {3, 2, 5}, dt), false, false, dt)); }},
      {Op::BatchedMatMul, "aᵀ 2x3x4 · b 2x3x5", {"a", "b"}, {Op::BatchedMatMul},
       [](Ctx& c, DType dt) { return c.b.batched_matmul(c.rand("a", {2, 3, 4}, dt), c.rand("b", {2, 3, 5}, dt), true, false, dt); }},
      {Op::BatchedMatMul, "a 2x4x3 · bᵀ 2x5x3", {"a", "b"}, {Op::BatchedMatMul},
       [](Ctx& c, DType dt) { return c.b.batched_matmul(c.rand("a", {2, 4, 3}, dt), c.rand("b", {2, 5, 3}, dt), false, true, dt); }},
      {Op::BatchedMatMul, "aᵀ 2x3x4 · bᵀ 2x5x3", {"a", "b"}, {Op::BatchedMatMul},
       [](Ctx& c, DType dt) { return c.b.batched_matmul(c.rand("a", {2, 3, 4}, dt), c.rand("b", {2, 5, 3}, dt), true, true, dt); }},
      {Op::MoeRouteWeights, "logits 5x6 k 3", {"logits"}, {Op::MoeRouteWeightsBackward},
       [](Ctx& c, DType dt) {
         const ValueId l = c.rand("logits", {5, 6}, dt);
         return c.b.moe_route_weights(l, c.b.moe_topk(l, 3), false);
       }},
      {Op::MoeRouteWeights, "logits 5x6 k 3 normalized", {"logits"}, {Op::MoeRouteWeightsBackward},
       [](Ctx& c, DType dt) {
         const ValueId l = c.rand("logits", {5, 6}, dt);
         return c.b.moe_route_weights(l, c.b.moe_topk(l, 3), true);
       }},
      {Op::MoeExperts, "x 6x5 E4 K2 F3", {"x", "w", "gate_up", "down"}, {Op::MoeExpertsBackward, Op::View},
       [](Ctx& c, DType dt) {
         return c.b.moe_experts(c.rand("x", {6, 5}, dt), c.i32("experts", {6, 2}, {0, 2, 2, 3, 1, 0, 3, 2, 0, 1, 2, 0}), c.rand("w", {6, 2}, dt),
                                c.rand("gate_up", {4, 6, 5}, dt), c.rand("down", {4, 5, 3}, dt));
       }},
      {Op::MoeExperts, "expert parallel: x 6x5 experts [2, 4) of 4 K2 F3", {"x", "w", "gate_up", "down"}, {Op::MoeExpertsBackward, Op::View},
       [](Ctx& c, DType dt) {
         return c.b.moe_experts(c.rand("x", {6, 5}, dt), c.i32("experts", {6, 2}, {0, 2, 2, 3, 1, 0, 3, 2, 0, 1, 2, 0}), c.rand("w", {6, 2}, dt),
                                c.rand("gate_up", {2, 6, 5}, dt), c.rand("down", {2, 5, 3}, dt), "", 2, 4);
       }},
      {Op::MoeExperts, "frozen experts: x 6x5 E4 K2 F3, x and w only", {"x", "w"}, {Op::MoeExpertsBackward, Op::View},
       [](Ctx& c, DType dt) {
         return c.b.moe_experts(c.rand("x", {6, 5}, dt), c.i32("experts", {6, 2}, {0, 2, 2, 3, 1, 0, 3, 2, 0, 1, 2, 0}), c.rand("w", {6, 2}, dt),
                                c.rand("gate_up", {4, 6, 5}, dt), c.rand("down", {4, 5, 3}, dt));
       }},
      {Op::MoeRouterStats, "aux loss of two layers: logits 7x5 k 2 masked", {"l0", "l1"}, {Op::MoeAuxLossBackward, Op::MoeRouterStatsBackward},
       [](Ctx& c, DType dt) {
         const ValueId mask = c.i32("mask", {7}, {1, 1, 0, 1, 2, 0, 1});
         const ValueId l0 = c.rand("l0", {7, 5}, dt), l1 = c.rand("l1", {7, 5}, dt);
         const ValueId s0 = c.b.moe_router_stats(l0, c.b.moe_topk(l0, 2), mask), s1 = c.b.moe_router_stats(l1, c.b.moe_topk(l1, 2), mask);
         return c.b.moe_aux_loss(c.b.add(s0, s1));
       }},
      {Op::WeightedSum, "x, weights 7", {"x", "weights"}, {Op::ScaleBy},
       [](Ctx& c, DType dt) { return c.b.weighted_sum(c.rand("x", {7}, dt), c.rand("weights", {7}, dt)); }},
  };
  return t;
}

// loss = Σ cast(out)·r (r random), its gradients with respect to `wrt` by autodiff; outputs: loss, then the gradients.
// Returns the id of the loss node.
ValueId build_loss_and_grads(Ctx& c, const VjpCase& v, DType dt, DType grad_dt, bool output_forward) {
  ValueId out = v.forward(c, dt);
  if (c.b.node(out).dtype != grad_dt) out = c.b.cast(out, grad_dt);
  const ValueId loss = c.b.weighted_sum(out, c.rand("r", c.b.shape(out), grad_dt));
  const auto grads = graph::add_backward(c.b, loss, v.wrt, grad_dt);
  if (output_forward) c.out(out);
  c.out(loss);
  for (const std::string& w : v.wrt) c.out(grads.at(w));
  return loss;
}

class OpTableVjp : public ::testing::TestWithParam<VjpCase> {};

// Central differences of the reference forward in f64: (L(x + ε) - L(x - ε)) / 2ε for up to 16 elements of each
// input, against the reference's backward ops.
TEST_P(OpTableVjp, ReferenceMatchesFiniteDifferences) {
  const VjpCase& v = GetParam();
  Ctx c(seed_of(v.name));
  const ValueId loss = build_loss_and_grads(c, v, DType::F64, DType::F64, false);
  const graph::Graph g = c.b.finish();
  for (Op op : v.backward_ops)
    EXPECT_TRUE(std::any_of(g.nodes.begin() + loss + 1, g.nodes.end(), [&](const graph::Node& n) { return n.op == op; }))
        << v.name << ": the backward graph has no " << graph::op_name(op);
  auto program = make_reference_backend()->compile(g);
  const std::vector<Tensor> base = program->run(c.inputs);
  for (size_t k = 0; k < v.wrt.size(); ++k) {
    const Tensor& grad = base[k + 1];
    const std::vector<double> gv = values_of(grad);
    double gmax = 0;
    for (double x : gv) {
      ASSERT_TRUE(std::isfinite(x)) << v.name << " d/d" << v.wrt[k];
      gmax = std::max(gmax, std::fabs(x));
    }
    ASSERT_GT(gmax, 0) << v.name << ": the gradient of " << v.wrt[k] << " is zero (a degenerate case)";
    const int64_t n = grad.numel(), step = std::max<int64_t>(1, n / 16);
    for (int64_t i = (n > 16 ? static_cast<int64_t>(seed_of(v.wrt[k]) % static_cast<uint64_t>(step)) : 0); i < n; i += step) {
      auto loss_at = [&](double delta) {
        TensorMap moved = c.inputs;
        Tensor t = moved.at(v.wrt[k]).clone();
        store_element(t.mutable_data(), DType::F64, i, load_element(t.data(), DType::F64, i) + delta);
        moved[v.wrt[k]] = t;
        return load_element(program->run(moved)[0].data(), DType::F64, 0);
      };
      const double eps = 1e-5;
      const double fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
      EXPECT_NEAR(gv[static_cast<size_t>(i)], fd, 1e-6 * std::max(1.0, gmax)) << v.name << ": d loss / d " << v.wrt[k] << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, OpTableVjp, ::testing::ValuesIn(vjp_table()),
                         [](const ::testing::TestParamInfo<VjpCase>& p) { return param_name(graph::op_name(p.param.op), p.param.name); });

// The same forward + backward graphs (f32 gradients; forward in f32 and in bf16) on every backend.
std::vector<OpCase> vjp_backend_cases() {
  std::vector<OpCase> t;
  for (const VjpCase& v : vjp_table())
    for (DType dt : {F32, BF16}) {
      // A KL value is a small difference of O(1) log-sum-exps (0.1 from terms near log V): in f32 the logits' own
      // rounding leaves about 1e-5 of it (1.18e-5 under clang 14, below 1e-5 under GCC 12), as jsd_cases says of
      // its gradients.
      const double tol = dt == F32 && v.op == Op::Jsd ? 3 * kF32 : tol_of(dt);
      add_case(t, v.op, fmt::format("backward graph {} {}", dn(dt), v.name), tol, [v, dt](Ctx& c) { build_loss_and_grads(c, v, dt, F32, true); });
    }
  make_names_unique(t);
  return t;
}

class OpTableVjpBackends : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpTableVjpBackends, MatchReference) { check_case(GetParam(), backends_under_test()); }

INSTANTIATE_TEST_SUITE_P(OpTable, OpTableVjpBackends, ::testing::ValuesIn(vjp_backend_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& p) { return param_name(graph::op_name(p.param.op), p.param.name); });

// Dropout's mask on every backend: about 1 − p of the elements kept, each kept one scaled by exactly 1/(1 − p), and
// the mask a function of (seed, stream): the same seed and stream give the same mask, another seed or stream another.
TEST(OpTable, DropoutMaskKeepsOneMinusPAndFollowsItsSeed) {
  constexpr int64_t N = 200000;
  constexpr double p = 0.25;
  for (const std::string& name : available_backends()) {
    SCOPED_TRACE(name);
    auto masks = [&](std::vector<int32_t> seed, int64_t stream) {
      Builder b;
      const ValueId x = b.fill({N}, DType::F32, 1.0);
      const ValueId sd = b.input("seed", {2}, DType::I32);
      b.output(b.dropout(x, sd, p, stream));
      auto program = make_backend(name)->compile(b.finish());
      return program->run({{"seed", Tensor::from_i32(seed, {2})}}).at(0).clone();
    };
    const Tensor a = masks({3, 4}, 0), again = masks({3, 4}, 0), other_seed = masks({3, 5}, 0), other_stream = masks({3, 4}, 1);
    int64_t kept = 0, same = 0, differ_seed = 0, differ_stream = 0;
    for (int64_t i = 0; i < N; ++i) {
      const float v = a.data_as<float>()[i];
      ASSERT_TRUE(v == 0.0f || v == static_cast<float>(1.0 / (1.0 - p))) << "element " << i << " is " << v;
      kept += v != 0.0f;
      same += v == again.data_as<float>()[i];
      differ_seed += v != other_seed.data_as<float>()[i];
      differ_stream += v != other_stream.data_as<float>()[i];
    }
    const double kept_fraction = static_cast<double>(kept) / N;  // binomial: σ ≈ 0.001
    EXPECT_NEAR(kept_fraction, 1.0 - p, 0.006);
    EXPECT_EQ(same, N);
    // Independent masks differ where exactly one keeps: 2·p·(1 − p) = 0.375 of the elements.
    EXPECT_NEAR(static_cast<double>(differ_seed) / N, 2 * p * (1 - p), 0.01);
    EXPECT_NEAR(static_cast<double>(differ_stream) / N, 2 * p * (1 - p), 0.01);
  }
}

TEST(OpTable, EveryDifferentiableOpHasAVjpCase) {
  std::set<Op> forward, backward;
  for (const VjpCase& v : vjp_table()) {
    forward.insert(v.op);
    backward.insert(v.backward_ops.begin(), v.backward_ops.end());
  }
  for (Op op : {Op::Embedding, Op::MatMul, Op::RmsNorm, Op::Rope, Op::Attention, Op::SwiGLU, Op::TokenLogprobs, Op::Entropy, Op::WeightedSum,
                Op::Dropout, Op::MoeRouteWeights, Op::MoeExperts, Op::MoeRouterStats, Op::BatchedMatMul})
    EXPECT_TRUE(forward.count(op)) << graph::op_name(op);
  for (Op op : {Op::MatMulNN, Op::MatMulTN, Op::SumRows, Op::ScaleBy, Op::EmbeddingBackward, Op::RmsNormBackX, Op::RmsNormBackW, Op::SwiGLUBackward,
                Op::AttentionBackward, Op::TokenLogprobsBackward, Op::EntropyBackward, Op::MoeRouteWeightsBackward, Op::MoeExpertsBackward,
                Op::MoeRouterStatsBackward, Op::MoeAuxLossBackward})
    EXPECT_TRUE(backward.count(op)) << graph::op_name(op);
}

// ---- perf mode (TRL_OP_PERF=1): medium shapes, time per run and throughput on each backend ----

struct PerfCase {
  Op op;
  std::string name;
  std::function<void(Ctx&)> build;
  double flops = 0;  // GEMM-like ops: GFLOP/s
  double bytes = 0;  // memory-bound ops: GB/s (0 with flops 0: zero-copy, time only)
};

std::vector<PerfCase> perf_table() {
  constexpr int64_t R = 512, C = 1024, F = 2816, H = 16, Hkv = 8, D = 64, V = 8192, T = 512;
  const double n = static_cast<double>(R * C), nf = static_cast<double>(R * F);
  const double att = 2.0 * H * T * T * D;  // one [T, S] x D GEMM over all heads, full square
  std::vector<PerfCase> t = {
      {Op::Embedding, "ids 1x512 table bf16 8192x1024", [](Ctx& c) { c.out(c.b.embedding(c.ids("ids", {1, R}, V), c.rand("table", {V, C}, BF16), BF16)); }, 0, 4 * n},
      {Op::MatMul, "f32 x 512x1024 w 1024x1024", [](Ctx& c) { c.out(c.b.matmul(c.rand("x", {R, C}, F32), c.rand("w", {C, C}, F32), kNone, F32)); }, 2 * n * C},
      {Op::MatMul, "bf16 x 512x1024 w 1024x1024", [](Ctx& c) { c.out(c.b.matmul(c.rand("x", {R, C}, BF16), c.rand("w", {C, C}, BF16), kNone, BF16)); }, 2 * n * C},
      {Op::MatMul, "bf16 GEMV x 1x1024 w 4096x1024", [](Ctx& c) { c.out(c.b.matmul(c.rand("x", {1, C}, BF16), c.rand("w", {4 * C, C}, BF16), kNone, BF16)); }, 0,
       2.0 * 4 * C * C},
      // Batch-1 decode's lm_head (Qwen3's vocabulary at hidden 2048: 622 MB, far past any cache): memory-bound.
      {Op::MatMul, "bf16 GEMV x 1x2048 w 151936x2048 -> f32",
       [](Ctx& c) { c.out(c.b.matmul(c.rand("x", {1, 2048}, BF16), c.rand("w", {151936, 2048}, BF16), kNone, F32)); }, 0, 2.0 * 151936 * 2048},
      {Op::MatMul, "f32 GEMV x 8x1024 w 4096x1024", [](Ctx& c) { c.out(c.b.matmul(c.rand("x", {8, C}, F32), c.rand("w", {4 * C, C}, F32), kNone, F32)); }, 0,
       4.0 * 4 * C * C},
      {Op::RmsNorm, "bf16 512x1024", [](Ctx& c) { c.out(c.b.rms_norm(c.rand("x", {R, C}, BF16), c.rand("w", {C}, BF16), 1e-6)); }, 0, 4 * n},
      {Op::Rope, "bf16 1x512x16x64", [](Ctx& c) { c.out(c.b.rope(c.rand("x", {1, T, H, D}, BF16), c.ids("pos", {1, T}, 4096), inv_freq(D), 1.0f)); }, 0, 4 * n},
      {Op::Attention, "bf16 causal 1x512x16x64 Hkv8",
       [](Ctx& c) { c.out(c.b.attention(c.rand("q", {1, T, H, D}, BF16), c.rand("k", {1, T, Hkv, D}, BF16), c.rand("v", {1, T, Hkv, D}, BF16), kNone, 0.125, true)); },
       2 * att / 2},
      {Op::Attention, "bf16 decode q_pos 1x1x16x64 cache S1024",
       [](Ctx& c) {
         c.out(c.b.attention(c.rand("q", {1, 1, H, D}, BF16), c.rand("k", {1, 1024, Hkv, D}, BF16), c.rand("v", {1, 1024, Hkv, D}, BF16), kNone, 0.125, true, "",
                             c.i32("q_pos", {1, 1}, {1023})));
       },
       0, 2.0 * 2 * 1024 * Hkv * D},
      {Op::SwiGLU, "bf16 512x2816", [](Ctx& c) { c.out(c.b.swiglu(c.rand("g", {R, F}, BF16), c.rand("u", {R, F}, BF16))); }, 0, 6 * nf},
      {Op::Add, "f32 512x1024", [](Ctx& c) { c.out(c.b.add(c.rand("a", {R, C}, F32), c.rand("b", {R, C}, F32))); }, 0, 12 * n},
      {Op::Add, "bf16 512x1024", [](Ctx& c) { c.out(c.b.add(c.rand("a", {R, C}, BF16), c.rand("b", {R, C}, BF16))); }, 0, 6 * n},
      {Op::Dropout, "bf16 512x1024 p 0.05", [](Ctx& c) { c.out(c.b.dropout(c.rand("x", {R, C}, BF16), c.i32("seed", {2}, {1, 2}), 0.05, 0)); }, 0, 4 * n},
      {Op::Cast, "f32 -> bf16 512x1024", [](Ctx& c) { c.out(c.b.cast(c.rand("x", {R, C}, F32), BF16)); }, 0, 6 * n},
      {Op::Reshape, "f32 512x1024 -> 1024x512 (zero-copy)", [](Ctx& c) { c.out(c.b.reshape(c.rand("x", {R, C}, F32), {C, R})); }},
      {Op::Slice, "bf16 1x1024x8x128 rows [0, 512)", [](Ctx& c) { c.out(c.b.slice(c.rand("x", {1, 1024, 8, 128}, BF16), 0, 512)); }, 0, 4.0 * 512 * 8 * 128},
      {Op::KvCacheWrite, "bf16 cache 1x1024x8x128 x T512",
       [](Ctx& c) {
         c.in_place = {"cache"};
         c.out(c.b.kv_cache_write(c.rand("cache", {1, 1024, 8, 128}, BF16), c.rand("x", {1, 512, 8, 128}, BF16), c.i32("pos", {1}, {256})));
       },
       0, 4.0 * 512 * 8 * 128},
      {Op::TokenLogprobs, "bf16 h 512x1024 w 8192x1024",
       [](Ctx& c) { c.out(c.b.token_logprobs(c.rand("h", {R, C}, BF16), c.rand("w", {V, C}, BF16), c.ids("t", {R}, V))); }, 2 * n * V},
      {Op::WeightedSum, "f32 512x1024", [](Ctx& c) { c.out(c.b.weighted_sum(c.rand("x", {R, C}, F32), c.rand("w", {R, C}, F32))); }, 0, 8 * n},
      {Op::Fill, "f32 512x1024", [](Ctx& c) { c.out(c.b.fill({R, C}, F32, 1.0)); }, 0, 4 * n},
      {Op::MatMulNN, "bf16 dy 512x1024 w 1024x1024 -> f32", [](Ctx& c) { c.out(c.b.matmul_nn(c.rand("dy", {R, C}, BF16), c.rand("w", {C, C}, BF16), F32)); }, 2 * n * C},
      {Op::MatMulTN, "bf16 a 512x1024 b 512x1024 -> f32", [](Ctx& c) { c.out(c.b.matmul_tn(c.rand("a", {R, C}, BF16), c.rand("b", {R, C}, BF16), F32)); }, 2 * n * C},
      {Op::SumRows, "f32 512x1024", [](Ctx& c) { c.out(c.b.sum_rows(c.rand("x", {R, C}, F32), F32)); }, 0, 4 * n},
      // LoRA's ΔW of 32 experts of a 1024-wide gate_up at r = 8.
      {Op::BatchedMatMul, "bf16 B 32x1024x8 A 32x8x1024 -> bf16",
       [](Ctx& c) { c.out(c.b.batched_matmul(c.rand("B", {32, C, 8}, BF16), c.rand("A", {32, 8, C}, BF16), false, false, BF16)); }, 2 * 32 * C * C * 8},
      {Op::ScaleBy, "f32 512x1024", [](Ctx& c) { c.out(c.b.scale_by(c.rand("w", {R, C}, F32), c.rand("s", {}, F32), F32)); }, 0, 8 * n},
      // One process: the copy and the stand-in group's pass (a real group's time is its communicator's).
      {Op::AllReduce, "f32 512x1024, stand-in group", [](Ctx& c) { c.out(c.b.all_reduce(c.rand("x", {R, C}, F32), fake_group())); }, 0, 16 * n},
      {Op::AllReduceGrad, "f32 512x1024", [](Ctx& c) { c.out(c.b.all_reduce_grad(c.rand("x", {R, C}, F32), fake_group())); }, 0, 8 * n},
      {Op::EmbeddingBackward, "ids 1x512 dy f32 512x1024 V8192",
       [](Ctx& c) { c.out(c.b.embedding_backward(c.ids("ids", {1, R}, V), c.rand("dy", {1, R, C}, F32), V, F32)); }, 0, 4.0 * V * C + 8 * n},
      {Op::RmsNormBackX, "x bf16 512x1024 dy f32", [](Ctx& c) { c.out(c.b.rms_norm_back_x(c.rand("x", {R, C}, BF16), c.rand("w", {C}, BF16), c.rand("dy", {R, C}, F32), 1e-6)); },
       0, 10 * n},
      {Op::RmsNormBackW, "x bf16 512x1024 dy f32", [](Ctx& c) { c.out(c.b.rms_norm_back_w(c.rand("x", {R, C}, BF16), c.rand("dy", {R, C}, F32), 1e-6, F32)); }, 0, 6 * n},
      {Op::SwiGLUBackward, "gate/up bf16 512x2816 dy f32",
       [](Ctx& c) {
         for (ValueId v : c.b.swiglu_backward(c.rand("g", {R, F}, BF16), c.rand("u", {R, F}, BF16), c.rand("dy", {R, F}, F32))) c.out(v);
       },
       0, 16 * nf},
      {Op::AttentionBackward, "bf16 causal 1x512x16x64 Hkv8 dy bf16",
       [](Ctx& c) {
         for (ValueId v : c.b.attention_backward(c.rand("q", {1, T, H, D}, BF16), c.rand("k", {1, T, Hkv, D}, BF16), c.rand("v", {1, T, Hkv, D}, BF16), kNone,
                                                 c.rand("dy", {1, T, H, D}, BF16), 0.125, true))
           c.out(v);
       },
       5 * att / 2},
      {Op::TokenLogprobsBackward, "bf16 h 512x1024 w 8192x1024",
       [](Ctx& c) {
         for (ValueId v : c.b.token_logprobs_backward(c.rand("h", {R, C}, BF16), c.rand("w", {V, C}, BF16), c.ids("t", {R}, V), c.rand("dl", {R}, F32))) c.out(v);
       },
       6 * n * V},
      {Op::Entropy, "bf16 h 512x1024 w 8192x1024", [](Ctx& c) { c.out(c.b.entropy(c.rand("h", {R, C}, BF16), c.rand("w", {V, C}, BF16))); }, 2 * n * V},
      {Op::EntropyBackward, "bf16 h 512x1024 w 8192x1024",
       [](Ctx& c) {
         for (ValueId v : c.b.entropy_backward(c.rand("h", {R, C}, BF16), c.rand("w", {V, C}, BF16), c.rand("dH", {R}, F32))) c.out(v);
       },
       6 * n * V},
      // Two lm_head GEMMs per pass; beta 0.5 makes two passes forward, and the backward adds dh and dw.
      {Op::Jsd, "bf16 student 512x1024 teacher 512x1024 w 8192 beta 0.5",
       [](Ctx& c) { c.out(c.b.jsd(c.rand("h", {R, C}, BF16), c.rand("w", {V, C}, BF16), c.rand("ht", {R, C}, BF16), c.rand("wt", {V, C}, BF16), 0.5)); },
       8 * n * V},
      {Op::JsdBackward, "bf16 student 512x1024 teacher 512x1024 w 8192 beta 0.5",
       [](Ctx& c) {
         const ValueId h = c.rand("h", {R, C}, BF16), w = c.rand("w", {V, C}, BF16), ht = c.rand("ht", {R, C}, BF16), wt = c.rand("wt", {V, C}, BF16);
         const ValueId v = c.b.jsd(h, w, ht, wt, 0.5);
         for (ValueId d : c.b.jsd_backward(h, w, ht, wt, c.rand("dj", {R}, F32), c.b.node(v).inputs[0])) c.out(d);
       },
       16 * n * V},
      {Op::TokenArgmaxMatch, "bf16 h 512x1024 w 8192x1024",
       [](Ctx& c) { c.out(c.b.token_argmax_match(c.rand("h", {R, C}, BF16), c.rand("w", {V, C}, BF16), c.ids("t", {R}, V))); }, 2 * n * V},
      {Op::VocabStats, "bf16 h 512x1024 w 8192x1024 targets entropy keep_logits",
       [](Ctx& c) {
         const ValueId st = c.b.vocab_stats(c.rand("h", {R, C}, BF16), c.rand("w", {V, C}, BF16), c.ids("t", {R}, V), true, true);
         c.out(c.b.vocab_stat(st, graph::VocabStat::Logprob));
       },
       2 * n * V},
      // Mixture of experts: 512 tokens, 32 experts of width 512 (a reduced Qwen3-MoE layer), 4 per token.
      {Op::MoeTopK, "bf16 logits 512x128 k 8", [](Ctx& c) { c.out(c.b.moe_topk(c.rand("l", {R, 128}, BF16), 8)); }, 0, 2.0 * R * 128},
      {Op::MoeRouteWeights, "bf16 logits 512x128 k 8", [](Ctx& c) {
         const ValueId l = c.rand("l", {R, 128}, BF16);
         c.out(c.b.moe_route_weights(l, c.b.moe_topk(l, 8), true));
       }, 0, 2.0 * R * 128},
      {Op::MoeRouteWeightsBackward, "bf16 logits 512x128 k 8", [](Ctx& c) {
         const ValueId l = c.rand("l", {R, 128}, BF16);
         c.out(c.b.moe_route_weights_backward(l, c.b.moe_topk(l, 8), c.rand("dw", {R, 8}, F32), true));
       }, 0, 6.0 * R * 128},
      {Op::MoeRouterStats, "bf16 logits 512x128 k 8", [](Ctx& c) {
         const ValueId l = c.rand("l", {R, 128}, BF16);
         c.out(c.b.moe_router_stats(l, c.b.moe_topk(l, 8), kNone));
       }, 0, 2.0 * R * 128},
      {Op::MoeRouterStatsBackward, "bf16 logits 512x128", [](Ctx& c) {
         c.out(c.b.moe_router_stats_backward(c.rand("l", {R, 128}, BF16), kNone, c.rand("ds", {257}, F32)));
       }, 0, 6.0 * R * 128},
      {Op::MoeAuxLoss, "stats 2x128+1", [](Ctx& c) { c.out(c.b.moe_aux_loss(c.rand("s", {257}, F32))); }},
      {Op::MoeAuxLossBackward, "stats 2x128+1", [](Ctx& c) { c.out(c.b.moe_aux_loss_backward(c.rand("s", {257}, F32), c.rand("g", {}, F32))); }},
      {Op::MoeExperts, "bf16 x 512x1024 E32 K4 F512", [](Ctx& c) {
         const ValueId l = c.rand("l", {R, 32}, BF16), e = c.b.moe_topk(l, 4);
         c.out(c.b.moe_experts(c.rand("x", {R, C}, BF16), e, c.b.cast(c.b.moe_route_weights(l, e, true), BF16), c.rand("gu", {32, 1024, C}, BF16, 0.1),
                               c.rand("dn", {32, C, 512}, BF16, 0.1)));
       }, 2.0 * R * 4 * 3 * 512 * C},
      // Decoding Qwen3-30B-A3B: one token, 8 of 128 experts of width 768 (memory-bound: each expert's weights once).
      {Op::MoeExperts, "bf16 decode x 1x2048 E128 K8 F768", [](Ctx& c) {
         const ValueId l = c.rand("l", {1, 128}, BF16), e = c.b.moe_topk(l, 8);
         c.out(c.b.moe_experts(c.rand("x", {1, 2048}, BF16), e, c.b.cast(c.b.moe_route_weights(l, e, true), BF16), c.rand("gu", {128, 1536, 2048}, BF16, 0.1),
                               c.rand("dn", {128, 2048, 768}, BF16, 0.1)));
       }, 0, 8.0 * 3 * 768 * 2048 * 2},
      {Op::MoeExpertsBackward, "bf16 x 512x1024 E32 K4 F512 dy f32", [](Ctx& c) {
         const ValueId l = c.rand("l", {R, 32}, BF16), e = c.b.moe_topk(l, 4);
         for (ValueId d : c.b.moe_experts_backward(c.rand("x", {R, C}, BF16), e, c.b.cast(c.b.moe_route_weights(l, e, true), BF16),
                                                   c.rand("gu", {32, 1024, C}, BF16, 0.1), c.rand("dn", {32, C, 512}, BF16, 0.1), c.rand("dy", {R, C}, F32)))
           c.out(d);
       }, 2.0 * R * 4 * 3 * 512 * C * 3},
      {Op::View, "f32 packed 2x512x1024 at 512x1024 (zero-copy)", [](Ctx& c) { c.out(c.b.view(c.rand("x", {2 * R * C}, F32), R * C, {R, C}, F32)); }},
  };
  return t;
}

TEST(OpTable, EveryOpHasAPerfCase) {
  std::set<Op> ops;
  for (const PerfCase& p : perf_table()) ops.insert(p.op);
  for (Op op : all_ops()) EXPECT_TRUE(ops.count(op)) << "op " << graph::op_name(op) << " has no perf case";
}

TEST(OpTable, Perf) {
  const char* env = std::getenv("TRL_OP_PERF");
  if (env == nullptr || std::string(env) != "1") GTEST_SKIP() << "set TRL_OP_PERF=1 to time the ops";
  ::unsetenv("TRL_CHECK_GUARDS");  // no guard checks in timing runs
  std::printf("%-24s %-44s %-8s %12s %14s\n", "op", "case", "backend", "ms/run", "throughput");
  for (const PerfCase& p : perf_table()) {
    Ctx c(seed_of(p.name));
    p.build(c);
    const graph::Graph g = c.b.finish();
    for (const auto& [bname, make] : backends_under_test()) {
      auto backend = make();
      auto program = backend->compile(g);
      for (const Tensor& o : program->run(c.inputs))  // warm-up, and a sanity check
        for (double x : values_of(o))
          if (!std::isfinite(x)) {
            ADD_FAILURE() << graph::op_name(p.op) << " " << p.name << " on " << bname << ": non-finite output";
            break;
          }
      int runs = 0;
      const auto t0 = std::chrono::steady_clock::now();
      double elapsed = 0;
      while (runs < 3 || (elapsed < 0.3 && runs < 200)) {
        program->run(c.inputs);
        ++runs;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      const double per_run = elapsed / runs;
      const std::string rate = p.flops > 0   ? fmt::format("{:.1f} GFLOP/s", p.flops / per_run * 1e-9)
                               : p.bytes > 0 ? fmt::format("{:.1f} GB/s", p.bytes / per_run * 1e-9)
                                             : std::string("(zero-copy)");
      std::printf("%-24s %-44s %-8s %12.4f %14s\n", graph::op_name(p.op), p.name.c_str(), bname.c_str(), per_run * 1e3, rate.c_str());
    }
  }
}

}  // namespace
}  // namespace trl

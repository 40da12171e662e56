#include "trl/graph/graph.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "trl/core/error.h"

namespace trl::graph {

const char* op_name(Op op) {
  switch (op) {
    case Op::Input: return "input";
    case Op::Embedding: return "embedding";
    case Op::MatMul: return "matmul";
    case Op::RmsNorm: return "rms_norm";
    case Op::Rope: return "rope";
    case Op::Attention: return "attention";
    case Op::SwiGLU: return "swiglu";
    case Op::Add: return "add";
    case Op::Cast: return "cast";
    case Op::Reshape: return "reshape";
    case Op::Slice: return "slice";
    case Op::KvCacheWrite: return "kv_cache_write";
    case Op::TokenLogprobs: return "token_logprobs";
    case Op::WeightedSum: return "weighted_sum";
    case Op::Fill: return "fill";
    case Op::MatMulNN: return "matmul_nn";
    case Op::MatMulTN: return "matmul_tn";
    case Op::SumRows: return "sum_rows";
    case Op::ScaleBy: return "scale_by";
    case Op::EmbeddingBackward: return "embedding_backward";
    case Op::RmsNormBackX: return "rms_norm_back_x";
    case Op::RmsNormBackW: return "rms_norm_back_w";
    case Op::SwiGLUBackward: return "swiglu_backward";
    case Op::AttentionBackward: return "attention_backward";
    case Op::TokenLogprobsBackward: return "token_logprobs_backward";
    case Op::Entropy: return "entropy";
    case Op::EntropyBackward: return "entropy_backward";
    case Op::TokenArgmaxMatch: return "token_argmax_match";
    case Op::VocabStats: return "vocab_stats";
    case Op::AllReduce: return "all_reduce";
    case Op::AllReduceGrad: return "all_reduce_grad";
    case Op::Dropout: return "dropout";
    case Op::Jsd: return "jsd";
    case Op::JsdBackward: return "jsd_backward";
    case Op::MoeTopK: return "moe_topk";
    case Op::MoeRouteWeights: return "moe_route_weights";
    case Op::BatchedMatMul: return "batched_matmul";
    case Op::MoeExperts: return "moe_experts";
    case Op::MoeRouterStats: return "moe_router_stats";
    case Op::MoeAuxLoss: return "moe_aux_loss";
    case Op::MoeRouteWeightsBackward: return "moe_route_weights_backward";
    case Op::MoeExpertsBackward: return "moe_experts_backward";
    case Op::MoeRouterStatsBackward: return "moe_router_stats_backward";
    case Op::MoeAuxLossBackward: return "moe_aux_loss_backward";
    case Op::View: return "view";
  }
  return "?";
}

std::string Graph::dump() const {
  std::string out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    std::string args;
    for (ValueId in : n.inputs) {
      if (!args.empty()) args += ", ";
      args += in == kNone ? std::string("-") : fmt::format("%{}", in);
    }
    out += fmt::format("%{} = {}({}) {} {}  {}\n", i, op_name(n.op), args, shape_str(n.shape), dtype_name(n.dtype), n.name);
  }
  return out;
}

namespace {
// FNV-1a-style mixing over bytes: the 64-bit digest of a key.
struct Hasher {
  uint64_t h = 14695981039346656037ull;
  void word(uint64_t w) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  }
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, b + i, 8);
      word(w);
    }
    uint64_t tail = n;
    for (; i < n; ++i) tail = (tail << 8) | b[i];
    word(tail);
  }
};
// Appends fixed-size values, and variable-size ones after their length, so that two graphs have the same key
// exactly when they have the same structure.
struct KeyWriter {
  std::string out;
  template <typename T> void pod(const T& v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void span(const void* p, size_t n) {
    pod(static_cast<uint64_t>(n));
    out.append(static_cast<const char*>(p), n);
  }
};
}  // namespace

std::string Graph::key() const {
  KeyWriter k;
  k.pod(static_cast<uint64_t>(nodes.size()));
  for (const Node& n : nodes) {
    k.pod(n.op);
    k.pod(n.dtype);
    k.span(n.shape.data(), n.shape.size() * sizeof(int64_t));
    k.span(n.inputs.data(), n.inputs.size() * sizeof(ValueId));
    if (n.op == Op::Input) k.span(n.name.data(), n.name.size());
    k.pod(n.attrs.eps);
    k.pod(n.attrs.scale);
    k.pod(n.attrs.causal);
    k.pod(n.attrs.rope_scaling);
    k.span(n.attrs.inv_freq.data(), n.attrs.inv_freq.size() * sizeof(float));
    k.pod(n.attrs.inverse);
    k.pod(n.attrs.rows);
    k.pod(n.attrs.offset);
    k.pod(n.attrs.value);
    k.pod(n.attrs.entropy);
    k.pod(n.attrs.keep_logits);
    k.pod(n.attrs.group);
    k.pod(n.attrs.vocab.group);
    k.pod(n.attrs.vocab.offset);
    k.pod(n.attrs.vocab.size);
    k.pod(n.attrs.dh_only);
    k.pod(n.attrs.normalize);
    k.pod(n.attrs.trans_a);
    k.pod(n.attrs.trans_b);
  }
  k.span(inputs.data(), inputs.size() * sizeof(ValueId));
  k.span(outputs.data(), outputs.size() * sizeof(ValueId));
  k.pod(static_cast<uint64_t>(seed_inputs.size()));
  for (const std::string& s : seed_inputs) {
    k.pod(static_cast<uint64_t>(s.size()));
    k.span(s.data(), s.size());
  }
  return std::move(k.out);
}

uint64_t Graph::hash() const { return hash_key(key()); }

size_t stage_boundary(const Graph& g) {
  std::vector<bool> late(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == Op::Input) {
      late[i] = std::find(g.seed_inputs.begin(), g.seed_inputs.end(), n.name) != g.seed_inputs.end();
      continue;
    }
    for (ValueId in : n.inputs)
      if (in != kNone && late[static_cast<size_t>(in)]) late[i] = true;
    if (late[i]) return i;
  }
  return g.nodes.size();
}

uint64_t hash_key(const std::string& key, uint64_t seed) {
  Hasher h;
  h.word(seed);
  h.bytes(key.data(), key.size());
  return h.h;
}

ValueId Builder::push(Node node) {
  node.segment = segment_;
  graph_.nodes.push_back(std::move(node));
  return static_cast<ValueId>(graph_.nodes.size() - 1);
}

void Builder::check(ValueId v, const char* what) const {
  if (v < 0 || static_cast<size_t>(v) >= graph_.nodes.size()) fail("graph builder: {}: invalid value id {}", what, v);
}

ValueId Builder::input(const std::string& name, Shape shape, DType dtype) {
  for (ValueId in : graph_.inputs) {
    if (graph_.node(in).name == name) fail("graph builder: input '{}' declared twice", name);
  }
  shape_numel(shape);
  Node n;
  n.op = Op::Input;
  n.shape = std::move(shape);
  n.dtype = dtype;
  n.name = name;
  ValueId id = push(std::move(n));
  graph_.inputs.push_back(id);
  return id;
}

namespace {
// A split table of `rows` rows: one of equal parts of the vocabulary, in it; the vocabulary ops combine over a group.
void check_split(const VocabSplit& s, int64_t rows, bool needs_group, const char* what, const std::string& name) {
  if (!s.split()) return;
  if (rows <= 0 || s.offset < 0 || s.offset % rows != 0 || s.size % rows != 0 || s.offset + rows > s.size)
    fail("{} {}: rows [{}, {}) are not one of equal parts of a vocabulary of {}", what, name, s.offset, s.offset + rows, s.size);
  if (needs_group && s.group == 0) fail("{} {}: a split vocabulary needs the collective group of its ranks", what, name);
}
}  // namespace

ValueId Builder::embedding(ValueId ids, ValueId table, DType out, const std::string& name, const VocabSplit& split) {
  check(ids, "embedding ids");
  check(table, "embedding table");
  const Node& i = node(ids);
  const Node& t = node(table);
  if (i.dtype != DType::I32) fail("embedding {}: ids must be i32, got {}", name, dtype_name(i.dtype));
  if (t.shape.size() != 2) fail("embedding {}: table must be [V, C], got {}", name, shape_str(t.shape));
  Node n;
  check_split(split, t.shape[0], false, "embedding", name);
  n.op = Op::Embedding;
  n.inputs = {ids, table};
  n.shape = i.shape;
  n.shape.push_back(t.shape[1]);
  n.dtype = out;
  n.name = name;
  n.attrs.vocab = split;
  return push(std::move(n));
}

int accumulate_input(const Node& n) {
  const auto has = [&](size_t k) { return n.inputs.size() > k && n.inputs[k] != kNone; };
  if (n.op == Op::MatMul && has(3)) return 3;
  if ((n.op == Op::MatMulNN || n.op == Op::EmbeddingBackward) && has(2)) return 2;
  return -1;
}

ValueId Builder::matmul(ValueId x, ValueId w, ValueId bias, DType out, const std::string& name, ValueId addend) {
  check(x, "matmul x");
  check(w, "matmul w");
  const Node& a = node(x);
  const Node& b = node(w);
  if (a.shape.empty() || b.shape.size() != 2 || a.shape.back() != b.shape[1]) {
    fail("matmul {}: x {} and w {} do not fit (x:[...,K] times w:[N,K])", name, shape_str(a.shape), shape_str(b.shape));
  }
  if (b.shape[1] == 0) fail("matmul {}: x {} and w {} have an empty reduction dimension (K = 0)", name, shape_str(a.shape), shape_str(b.shape));
  if (bias != kNone) {
    check(bias, "matmul bias");
    const Node& c = node(bias);
    if (c.shape != Shape{b.shape[0]}) fail("matmul {}: bias {} must be [{}]", name, shape_str(c.shape), b.shape[0]);
  }
  Node n;
  n.op = Op::MatMul;
  n.inputs = {x, w, bias};
  n.shape = a.shape;
  n.shape.back() = b.shape[0];
  n.dtype = out;
  n.name = name;
  if (addend != kNone) {
    check(addend, "matmul addend");
    if (shape(addend) != n.shape || node(addend).dtype != out)
      fail("matmul {}: the addend {} {} must be the result's {} {}", name, dtype_name(node(addend).dtype), shape_str(shape(addend)), dtype_name(out),
           shape_str(n.shape));
    n.inputs.push_back(addend);
  }
  return push(std::move(n));
}

ValueId Builder::rms_norm(ValueId x, ValueId w, double eps, const std::string& name) {
  check(x, "rms_norm x");
  check(w, "rms_norm w");
  const Node& a = node(x);
  const Node& b = node(w);
  if (a.shape.empty() || b.shape != Shape{a.shape.back()}) {
    fail("rms_norm {}: weight {} must match the last dimension of x {}", name, shape_str(b.shape), shape_str(a.shape));
  }
  if (a.shape.back() == 0) fail("rms_norm {}: x {} has an empty last dimension", name, shape_str(a.shape));
  Node n;
  n.op = Op::RmsNorm;
  n.inputs = {x, w};
  n.shape = a.shape;
  n.dtype = a.dtype;
  n.name = name;
  n.attrs.eps = eps;
  return push(std::move(n));
}

ValueId Builder::rope(ValueId x, ValueId positions, std::vector<float> inv_freq, float scaling, const std::string& name) {
  check(x, "rope x");
  check(positions, "rope positions");
  const Node& a = node(x);
  const Node& p = node(positions);
  if (a.shape.size() != 4) fail("rope {}: x must be [B,T,H,D], got {}", name, shape_str(a.shape));
  if (p.dtype != DType::I32 || p.shape != Shape{a.shape[0], a.shape[1]}) {
    fail("rope {}: positions must be i32 [B,T] = [{}, {}], got {} {}", name, a.shape[0], a.shape[1], dtype_name(p.dtype), shape_str(p.shape));
  }
  if (static_cast<int64_t>(inv_freq.size()) * 2 != a.shape[3]) fail("rope {}: {} frequencies for head dim {}", name, inv_freq.size(), a.shape[3]);
  Node n;
  n.op = Op::Rope;
  n.inputs = {x, positions};
  n.shape = a.shape;
  n.dtype = a.dtype;
  n.name = name;
  n.attrs.inv_freq = std::move(inv_freq);
  n.attrs.rope_scaling = scaling;
  return push(std::move(n));
}

ValueId Builder::attention(ValueId q, ValueId k, ValueId v, ValueId key_mask, double scale, bool causal, const std::string& name,
                           ValueId q_pos, ValueId cache_rows) {
  check(q, "attention q");
  check(k, "attention k");
  check(v, "attention v");
  const Shape& qs = node(q).shape;
  const Shape& ks = node(k).shape;
  const Shape& vs = node(v).shape;
  // With cache_rows, k/v are a cache of any number of rows and query row b reads cache row cache_rows[b].
  const bool rows_given = cache_rows != kNone;
  if (qs.size() != 4 || ks.size() != 4 || vs != ks || (!rows_given && qs[0] != ks[0]) || qs[3] != ks[3] || ks[2] == 0 || qs[2] % ks[2] != 0) {
    fail("attention {}: q {} and k/v {} / {} must be [B,T,H,D] and [B,S,Hkv,D] with H a multiple of Hkv", name, shape_str(qs),
         shape_str(ks), shape_str(vs));
  }
  if (rows_given) {
    check(cache_rows, "attention cache_rows");
    const Node& r = node(cache_rows);
    if (q_pos == kNone) fail("attention {}: cache_rows needs q_pos (the queries' places in the cache)", name);
    if (r.dtype != DType::I32 || r.shape != Shape{qs[0]})
      fail("attention {}: cache_rows must be i32 [B] = [{}], got {} {}", name, qs[0], dtype_name(r.dtype), shape_str(r.shape));
  }
  // Without q_pos, query t sits at key index t + S - T: more queries than keys would place some before the first key.
  if (q_pos == kNone && qs[1] > ks[1]) fail("attention {}: {} queries need at least as many keys, got S = {}", name, qs[1], ks[1]);
  if (q_pos != kNone) {
    check(q_pos, "attention q_pos");
    const Node& m = node(q_pos);
    if (m.dtype != DType::I32 || m.shape != Shape{qs[0], qs[1]})
      fail("attention {}: q_pos must be i32 [B,T] = [{}, {}], got {} {}", name, qs[0], qs[1], dtype_name(m.dtype), shape_str(m.shape));
  }
  if (key_mask != kNone) {
    check(key_mask, "attention key_mask");
    const Node& m = node(key_mask);
    if (m.dtype != DType::I32 || m.shape != Shape{qs[0], ks[1]}) {
      fail("attention {}: key_mask must be i32 [B,S] = [{}, {}], got {} {}", name, qs[0], ks[1], dtype_name(m.dtype), shape_str(m.shape));
    }
  }
  Node n;
  n.op = Op::Attention;
  n.inputs = {q, k, v, key_mask};
  if (q_pos != kNone) n.inputs.push_back(q_pos);
  if (rows_given) n.inputs.push_back(cache_rows);
  n.shape = qs;
  n.dtype = node(q).dtype;
  n.name = name;
  n.attrs.scale = scale;
  n.attrs.causal = causal;
  return push(std::move(n));
}

ValueId Builder::swiglu(ValueId gate, ValueId up, const std::string& name) {
  check(gate, "swiglu gate");
  check(up, "swiglu up");
  if (node(gate).shape != node(up).shape) {
    fail("swiglu {}: gate {} and up {} differ in shape", name, shape_str(node(gate).shape), shape_str(node(up).shape));
  }
  Node n;
  n.op = Op::SwiGLU;
  n.inputs = {gate, up};
  n.shape = node(gate).shape;
  n.dtype = node(gate).dtype;
  n.name = name;
  return push(std::move(n));
}

ValueId Builder::add(ValueId a, ValueId b, const std::string& name) {
  check(a, "add a");
  check(b, "add b");
  if (node(a).shape != node(b).shape) fail("add {}: shapes {} and {} differ", name, shape_str(node(a).shape), shape_str(node(b).shape));
  Node n;
  n.op = Op::Add;
  n.inputs = {a, b};
  n.shape = node(a).shape;
  n.dtype = node(a).dtype;
  n.name = name;
  return push(std::move(n));
}

ValueId Builder::cast(ValueId x, DType out, const std::string& name) {
  check(x, "cast x");
  Node n;
  n.op = Op::Cast;
  n.inputs = {x};
  n.shape = node(x).shape;
  n.dtype = out;
  n.name = name;
  return push(std::move(n));
}

ValueId Builder::reshape(ValueId x, Shape shape, const std::string& name) {
  check(x, "reshape x");
  if (shape_numel(shape) != shape_numel(node(x).shape)) {
    fail("reshape {}: cannot view {} as {}", name, shape_str(node(x).shape), shape_str(shape));
  }
  Node n;
  n.op = Op::Reshape;
  n.inputs = {x};
  n.shape = std::move(shape);
  n.dtype = node(x).dtype;
  n.name = name;
  return push(std::move(n));
}

ValueId Builder::find_input(const std::string& name) const {
  for (ValueId in : graph_.inputs)
    if (graph_.node(in).name == name) return in;
  return kNone;
}

namespace {
Node make_node(Op op, std::vector<ValueId> inputs, Shape shape, DType dtype, const std::string& name) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.shape = std::move(shape);
  n.dtype = dtype;
  n.name = name;
  return n;
}
Shape leading(const Shape& s) { return Shape(s.begin(), s.end() - 1); }
}  // namespace

ValueId Builder::slice(ValueId x, int64_t start, int64_t length, const std::string& name) {
  check(x, "slice x");
  Shape s = node(x).shape;
  if (s.size() < 2 || start < 0 || length <= 0 || start + length > s[1])
    fail("slice {}: rows [{}, {}) of dimension 1 do not fit {}", name, start, start + length, shape_str(s));
  s[1] = length;
  Node n = make_node(Op::Slice, {x}, s, node(x).dtype, name);
  n.attrs.offset = start;
  n.attrs.rows = length;
  return push(std::move(n));
}

ValueId Builder::kv_cache_write(ValueId cache, ValueId x, ValueId pos, const std::string& name, ValueId rows) {
  check(cache, "kv_cache_write cache");
  check(x, "kv_cache_write x");
  check(pos, "kv_cache_write pos");
  const Shape& cs = node(cache).shape;
  const Shape& xs = node(x).shape;
  const Shape& ps = node(pos).shape;
  const bool rows_given = rows != kNone;
  if (cs.size() != 4 || xs.size() != 4 || (rows_given ? cs[0] < 1 : cs[0] != xs[0]) || cs[2] != xs[2] || cs[3] != xs[3] || xs[1] > cs[1] ||
      node(pos).dtype != DType::I32 || (ps != Shape{1} && ps != Shape{xs[0]}))
    fail("kv_cache_write {}: cache {} and x {} must be [B,S,Hkv,D] and [B,T,Hkv,D] with T <= S, pos i32 [1] or [B] (got {})", name, shape_str(cs),
         shape_str(xs), shape_str(ps));
  if (rows_given) {
    check(rows, "kv_cache_write rows");
    if (node(rows).dtype != DType::I32 || node(rows).shape != Shape{xs[0]})
      fail("kv_cache_write {}: rows must be i32 [B] = [{}], got {} {}", name, xs[0], dtype_name(node(rows).dtype), shape_str(node(rows).shape));
    return push(make_node(Op::KvCacheWrite, {cache, x, pos, rows}, cs, node(cache).dtype, name));
  }
  return push(make_node(Op::KvCacheWrite, {cache, x, pos}, cs, node(cache).dtype, name));
}

// A per-token op on the logits h·wᵀ with one target per token: h:[...,C], w:[V,C], targets:[...] i32 -> [...].
ValueId Builder::head_target_op(Op op, ValueId h, ValueId w, ValueId targets, DType out, const std::string& name, const VocabSplit& split) {
  const std::string what = op_name(op);
  check(h, (what + " h").c_str());
  check(w, (what + " w").c_str());
  check(targets, (what + " targets").c_str());
  const Shape& hs = shape(h);
  if (hs.empty() || shape(w).size() != 2 || shape(w)[1] != hs.back() || shape(targets) != leading(hs) || node(targets).dtype != DType::I32) {
    fail("{} {}: h {} w {} targets {} do not fit (h:[...,C], w:[V,C], targets:[...] i32)", what, name, shape_str(hs), shape_str(shape(w)),
         shape_str(shape(targets)));
  }
  check_split(split, shape(w)[0], true, what.c_str(), name);
  Node n = make_node(op, {h, w, targets}, leading(hs), out, name);
  n.attrs.vocab = split;
  return push(std::move(n));
}

ValueId Builder::token_logprobs(ValueId h, ValueId w, ValueId targets, const std::string& name, const VocabSplit& split) {
  return head_target_op(Op::TokenLogprobs, h, w, targets, node(h).dtype == DType::F64 ? DType::F64 : DType::F32, name, split);
}

ValueId Builder::token_argmax_match(ValueId h, ValueId w, ValueId targets, const std::string& name, const VocabSplit& split) {
  return head_target_op(Op::TokenArgmaxMatch, h, w, targets, DType::F32, name, split);
}

ValueId Builder::entropy(ValueId h, ValueId w, const std::string& name, const VocabSplit& split) {
  check(h, "entropy h");
  check(w, "entropy w");
  const Shape& hs = shape(h);
  if (hs.empty() || shape(w).size() != 2 || shape(w)[1] != hs.back())
    fail("entropy {}: h {} w {} do not fit (h:[...,C], w:[V,C])", name, shape_str(hs), shape_str(shape(w)));
  check_split(split, shape(w)[0], true, "entropy", name);
  Node n = make_node(Op::Entropy, {h, w}, leading(hs), node(h).dtype == DType::F64 ? DType::F64 : DType::F32, name);
  n.attrs.vocab = split;
  return push(std::move(n));
}

ValueId Builder::weighted_sum(ValueId x, ValueId weights, const std::string& name) {
  check(x, "weighted_sum x");
  check(weights, "weighted_sum weights");
  if (shape(x) != shape(weights)) fail("weighted_sum {}: x {} and weights {} differ", name, shape_str(shape(x)), shape_str(shape(weights)));
  return push(make_node(Op::WeightedSum, {x, weights}, {}, node(x).dtype == DType::F64 ? DType::F64 : DType::F32, name));
}

ValueId Builder::fill(Shape s, DType dtype, double value, const std::string& name) {
  Node n = make_node(Op::Fill, {}, std::move(s), dtype, name);
  n.attrs.value = value;
  return push(std::move(n));
}

ValueId Builder::dropout(ValueId x, ValueId seed, double p, int64_t stream, const std::string& name) {
  check(x, "dropout x");
  check(seed, "dropout seed");
  if (node(seed).dtype != DType::I32 || shape(seed) != Shape{2})
    fail("dropout {}: the seed must be i32 [2], got {} {}", name, dtype_name(node(seed).dtype), shape_str(shape(seed)));
  if (!(p >= 0 && p < 1)) fail("dropout {}: p must be in [0, 1), got {}", name, p);
  Node n = make_node(Op::Dropout, {x, seed}, shape(x), node(x).dtype, name);
  n.attrs.value = p;
  n.attrs.offset = stream;
  return push(std::move(n));
}

ValueId Builder::matmul_nn(ValueId dy, ValueId w, DType out, const std::string& name, ValueId addend) {
  check(dy, "matmul_nn dy");
  check(w, "matmul_nn w");
  const Shape& a = shape(dy);
  const Shape& b = shape(w);
  if (a.empty() || b.size() != 2 || a.back() != b[0]) fail("matmul_nn {}: {} · {} do not fit", name, shape_str(a), shape_str(b));
  Shape o = a;
  o.back() = b[1];
  Node n = make_node(Op::MatMulNN, {dy, w}, o, out, name);
  if (addend != kNone) {
    check(addend, "matmul_nn addend");
    if (shape(addend) != o || node(addend).dtype != out)
      fail("matmul_nn {}: the addend {} {} must be the result's {} {}", name, dtype_name(node(addend).dtype), shape_str(shape(addend)), dtype_name(out),
           shape_str(o));
    n.inputs.push_back(addend);
  }
  return push(std::move(n));
}

bool Builder::fold_addend(ValueId sum, ValueId addend) {
  check(sum, "fold_addend sum");
  check(addend, "fold_addend addend");
  Node& n = graph_.nodes[static_cast<size_t>(sum)];
  if (n.op != Op::MatMulNN || n.inputs.size() != 2 || addend >= sum || shape(addend) != n.shape || node(addend).dtype != n.dtype) return false;
  n.inputs.push_back(addend);
  return true;
}

ValueId Builder::matmul_tn(ValueId a, ValueId b, DType out, const std::string& name) {
  check(a, "matmul_tn a");
  check(b, "matmul_tn b");
  const Shape& x = shape(a);
  const Shape& y = shape(b);
  if (x.empty() || y.empty() || leading(x) != leading(y)) fail("matmul_tn {}: {}ᵀ · {} do not fit", name, shape_str(x), shape_str(y));
  return push(make_node(Op::MatMulTN, {a, b}, {x.back(), y.back()}, out, name));
}

ValueId Builder::sum_rows(ValueId x, DType out, const std::string& name) {
  check(x, "sum_rows x");
  return push(make_node(Op::SumRows, {x}, {shape(x).back()}, out, name));
}

ValueId Builder::all_reduce(ValueId x, int32_t group, const std::string& name) {
  check(x, "all_reduce x");
  if (node(x).dtype != DType::F32 && node(x).dtype != DType::BF16) fail("all_reduce {}: x must be f32 or bf16, got {}", name, dtype_name(node(x).dtype));
  Node n = make_node(Op::AllReduce, {x}, shape(x), node(x).dtype, name);
  n.attrs.group = group;
  return push(std::move(n));
}

ValueId Builder::all_reduce_grad(ValueId x, int32_t group, const std::string& name) {
  check(x, "all_reduce_grad x");
  if (node(x).dtype != DType::F32 && node(x).dtype != DType::BF16)
    fail("all_reduce_grad {}: x must be f32 or bf16, got {}", name, dtype_name(node(x).dtype));
  Node n = make_node(Op::AllReduceGrad, {x}, shape(x), node(x).dtype, name);
  n.attrs.group = group;
  return push(std::move(n));
}

// ---- mixture of experts ----
namespace {
// logits must be [N, E] of a floating dtype; experts [N, K] i32 with K <= E.
void check_router(const Graph& g, ValueId logits, ValueId experts, const char* op, const std::string& name) {
  const Node& l = g.node(logits);
  if (l.shape.size() != 2 || !dtype_is_float(l.dtype) || l.shape[1] < 1)
    fail("{} {}: router logits must be floating [N, E], got {} {}", op, name, dtype_name(l.dtype), shape_str(l.shape));
  if (experts == kNone) return;
  const Node& e = g.node(experts);
  if (e.dtype != DType::I32 || e.shape.size() != 2 || e.shape[0] != l.shape[0] || e.shape[1] < 1 || e.shape[1] > l.shape[1])
    fail("{} {}: experts must be i32 [{}, K] with 1 <= K <= {}, got {} {}", op, name, l.shape[0], l.shape[1], dtype_name(e.dtype), shape_str(e.shape));
}
void check_mask(const Graph& g, ValueId mask, int64_t N, const char* op, const std::string& name) {
  if (mask == kNone) return;
  const Node& m = g.node(mask);
  if (m.dtype != DType::I32 || m.shape != Shape{N}) fail("{} {}: mask must be i32 [{}], got {} {}", op, name, N, dtype_name(m.dtype), shape_str(m.shape));
}
}  // namespace

ValueId Builder::moe_topk(ValueId logits, int64_t k, const std::string& name) {
  check(logits, "moe_topk logits");
  check_router(graph_, logits, kNone, "moe_topk", name);
  const int64_t N = shape(logits)[0], E = shape(logits)[1];
  if (k < 1 || k > E) fail("moe_topk {}: k must be in [1, {}] (the number of experts), got {}", name, E, k);
  Node n = make_node(Op::MoeTopK, {logits}, {N, k}, DType::I32, name);
  n.attrs.rows = k;
  return push(std::move(n));
}

ValueId Builder::moe_route_weights(ValueId logits, ValueId experts, bool normalize, const std::string& name) {
  check(logits, "moe_route_weights logits");
  check(experts, "moe_route_weights experts");
  check_router(graph_, logits, experts, "moe_route_weights", name);
  Node n = make_node(Op::MoeRouteWeights, {logits, experts}, shape(experts), node(logits).dtype == DType::F64 ? DType::F64 : DType::F32, name);
  n.attrs.normalize = normalize;
  return push(std::move(n));
}

ValueId Builder::moe_experts(ValueId x, ValueId experts, ValueId weights, ValueId gate_up, ValueId down, const std::string& name,
                             int64_t first_expert, int64_t num_experts) {
  for (auto [v, what] : {std::pair{x, "x"}, {experts, "experts"}, {weights, "weights"}, {gate_up, "gate_up"}, {down, "down"}}) check(v, what);
  const Shape xs = shape(x), es = shape(experts), ws = shape(weights), gs = shape(gate_up), ds = shape(down);
  if (xs.size() != 2 || !dtype_is_float(node(x).dtype)) fail("moe_experts {}: x must be floating [N, C], got {}", name, shape_str(xs));
  if (gs.size() != 3 || gs[2] != xs[1] || gs[1] % 2 != 0 || gs[1] == 0)
    fail("moe_experts {}: gate_up must be [E, 2F, C] with C = {}, got {}", name, xs[1], shape_str(gs));
  const int64_t E = gs[0], F = gs[1] / 2, C = xs[1], total = num_experts > 0 ? num_experts : E;
  if (ds != Shape{E, C, F}) fail("moe_experts {}: down must be [E, C, F] = [{}, {}, {}], got {}", name, E, C, F, shape_str(ds));
  if (first_expert < 0 || first_expert + E > total)
    fail("moe_experts {}: experts [{}, {}) are not a range of the {} experts", name, first_expert, first_expert + E, total);
  if (node(experts).dtype != DType::I32 || es.size() != 2 || es[0] != xs[0] || es[1] < 1 || es[1] > total)
    fail("moe_experts {}: experts must be i32 [{}, K] with 1 <= K <= {}, got {} {}", name, xs[0], total, dtype_name(node(experts).dtype), shape_str(es));
  if (ws != es || !dtype_is_float(node(weights).dtype)) fail("moe_experts {}: weights must be floating {}, got {}", name, shape_str(es), shape_str(ws));
  if (node(gate_up).dtype != node(x).dtype || node(down).dtype != node(x).dtype)
    fail("moe_experts {}: x, gate_up and down must share a dtype, got {}, {}, {}", name, dtype_name(node(x).dtype), dtype_name(node(gate_up).dtype),
         dtype_name(node(down).dtype));
  Node n = make_node(Op::MoeExperts, {x, experts, weights, gate_up, down}, xs, node(x).dtype, name);
  n.attrs.offset = first_expert;
  n.attrs.rows = num_experts > 0 ? num_experts : 0;
  return push(std::move(n));
}

ValueId Builder::batched_matmul(ValueId a, ValueId b, bool trans_a, bool trans_b, DType out, const std::string& name) {
  check(a, "batched_matmul a");
  check(b, "batched_matmul b");
  const Shape as = shape(a), bs = shape(b);
  if (as.size() != 3 || bs.size() != 3 || as[0] != bs[0])
    fail("batched_matmul {}: a and b must be [E, rows, columns] with the same E, got {} and {}", name, shape_str(as), shape_str(bs));
  const int64_t M = trans_a ? as[2] : as[1], K = trans_a ? as[1] : as[2], Kb = trans_b ? bs[2] : bs[1], N = trans_b ? bs[1] : bs[2];
  if (K != Kb) fail("batched_matmul {}: op(a) {} and op(b) {} do not fit ({} != {})", name, shape_str(as), shape_str(bs), K, Kb);
  if (!dtype_is_float(node(a).dtype) || node(a).dtype != node(b).dtype || !dtype_is_float(out))
    fail("batched_matmul {}: a and b must share a floating dtype, got {} and {}", name, dtype_name(node(a).dtype), dtype_name(node(b).dtype));
  Node n = make_node(Op::BatchedMatMul, {a, b}, {as[0], M, N}, out, name);
  n.attrs.trans_a = trans_a;
  n.attrs.trans_b = trans_b;
  return push(std::move(n));
}

ValueId Builder::moe_router_stats(ValueId logits, ValueId experts, ValueId mask, const std::string& name) {
  check(logits, "moe_router_stats logits");
  check(experts, "moe_router_stats experts");
  if (mask != kNone) check(mask, "moe_router_stats mask");
  check_router(graph_, logits, experts, "moe_router_stats", name);
  check_mask(graph_, mask, shape(logits)[0], "moe_router_stats", name);
  const int64_t E = shape(logits)[1];
  return push(make_node(Op::MoeRouterStats, {logits, experts, mask}, {2 * E + 1}, node(logits).dtype == DType::F64 ? DType::F64 : DType::F32, name));
}

ValueId Builder::moe_aux_loss(ValueId stats, const std::string& name) {
  check(stats, "moe_aux_loss stats");
  const Shape s = shape(stats);
  if (s.size() != 1 || s[0] < 3 || s[0] % 2 != 1 || !dtype_is_float(node(stats).dtype))
    fail("moe_aux_loss {}: stats must be floating [2E + 1] (moe_router_stats), got {}", name, shape_str(s));
  return push(make_node(Op::MoeAuxLoss, {stats}, {}, node(stats).dtype, name));
}

ValueId Builder::moe_route_weights_backward(ValueId logits, ValueId experts, ValueId dweights, bool normalize, const std::string& name) {
  check(dweights, "moe_route_weights_backward dweights");
  check_router(graph_, logits, experts, "moe_route_weights_backward", name);
  if (shape(dweights) != shape(experts)) fail("moe_route_weights_backward {}: dweights must be {}", name, shape_str(shape(experts)));
  Node n = make_node(Op::MoeRouteWeightsBackward, {logits, experts, dweights}, shape(logits), node(dweights).dtype, name);
  n.attrs.normalize = normalize;
  return push(std::move(n));
}

std::vector<ValueId> Builder::moe_experts_backward(ValueId x, ValueId experts, ValueId weights, ValueId gate_up, ValueId down, ValueId dy,
                                                   const std::string& name, bool with_dw, int64_t first_expert, int64_t num_experts) {
  check(dy, "moe_experts_backward dy");
  if (shape(dy) != shape(x)) fail("moe_experts_backward {}: dy must be {}", name, shape_str(shape(x)));
  const Shape xs = shape(x), ws = shape(weights), gs = shape(gate_up), ds = shape(down);  // copies: push() may reallocate
  const int64_t nx = shape_numel(xs), nw = shape_numel(ws), ng = with_dw ? shape_numel(gs) : 0, nd = with_dw ? shape_numel(ds) : 0;
  const DType dt = node(dy).dtype;
  Node n = make_node(Op::MoeExpertsBackward, {x, experts, weights, gate_up, down, dy}, {nx + nw + ng + nd}, dt, name);
  n.attrs.dh_only = !with_dw;
  n.attrs.offset = first_expert;
  n.attrs.rows = num_experts;
  const ValueId packed = push(std::move(n));
  return {view(packed, 0, xs, dt, name + ".dx"), view(packed, nx, ws, dt, name + ".dweights"),
          with_dw ? view(packed, nx + nw, gs, dt, name + ".dgate_up") : kNone, with_dw ? view(packed, nx + nw + ng, ds, dt, name + ".ddown") : kNone};
}

ValueId Builder::moe_router_stats_backward(ValueId logits, ValueId mask, ValueId dstats, const std::string& name) {
  check(dstats, "moe_router_stats_backward dstats");
  check_router(graph_, logits, kNone, "moe_router_stats_backward", name);
  check_mask(graph_, mask, shape(logits)[0], "moe_router_stats_backward", name);
  if (shape(dstats) != Shape{2 * shape(logits)[1] + 1}) fail("moe_router_stats_backward {}: dstats must be [{}]", name, 2 * shape(logits)[1] + 1);
  return push(make_node(Op::MoeRouterStatsBackward, {logits, mask, dstats}, shape(logits), node(dstats).dtype, name));
}

ValueId Builder::moe_aux_loss_backward(ValueId stats, ValueId dloss, const std::string& name) {
  check(stats, "moe_aux_loss_backward stats");
  check(dloss, "moe_aux_loss_backward dloss");
  if (!shape(dloss).empty()) fail("moe_aux_loss_backward {}: dloss must be a scalar", name);
  return push(make_node(Op::MoeAuxLossBackward, {stats, dloss}, shape(stats), node(dloss).dtype, name));
}

ValueId Builder::scale_by(ValueId w, ValueId s, DType out, const std::string& name) {
  check(w, "scale_by w");
  check(s, "scale_by s");
  if (!shape(s).empty()) fail("scale_by {}: the scale must be a scalar", name);
  return push(make_node(Op::ScaleBy, {w, s}, shape(w), out, name));
}

ValueId Builder::embedding_backward(ValueId ids, ValueId dy, int64_t rows, DType out, const std::string& name, ValueId base,
                                    const VocabSplit& split) {
  check(ids, "embedding_backward ids");
  check(dy, "embedding_backward dy");
  if (base != kNone && shape(base) != Shape{rows, shape(dy).back()}) fail("embedding_backward {}: base has the wrong shape", name);
  check_split(split, rows, false, "embedding_backward", name);
  Node n = make_node(Op::EmbeddingBackward, {ids, dy, base}, {rows, shape(dy).back()}, out, name);
  n.attrs.rows = rows;
  n.attrs.vocab = split;
  return push(std::move(n));
}

ValueId Builder::rms_norm_back_x(ValueId x, ValueId w, ValueId dy, double eps, const std::string& name) {
  Node n = make_node(Op::RmsNormBackX, {x, w, dy}, shape(x), node(dy).dtype, name);
  n.attrs.eps = eps;
  return push(std::move(n));
}

ValueId Builder::rms_norm_back_w(ValueId x, ValueId dy, double eps, DType out, const std::string& name) {
  Node n = make_node(Op::RmsNormBackW, {x, dy}, {shape(x).back()}, out, name);
  n.attrs.eps = eps;
  return push(std::move(n));
}

ValueId Builder::view(ValueId packed, int64_t offset, Shape s, DType dtype, const std::string& name) {
  check(packed, "view");
  if (offset < 0 || offset + shape_numel(s) > shape_numel(shape(packed))) fail("view {}: out of range", name);
  Node n = make_node(Op::View, {packed}, std::move(s), dtype, name);
  n.attrs.offset = offset;
  return push(std::move(n));
}

std::vector<ValueId> Builder::swiglu_backward(ValueId gate, ValueId up, ValueId dy, const std::string& name) {
  const Shape s = shape(gate);  // a copy: push() below may reallocate the node list
  const int64_t n = shape_numel(s);
  const DType dt = node(dy).dtype;
  const ValueId packed = push(make_node(Op::SwiGLUBackward, {gate, up, dy}, {2 * n}, dt, name));
  return {view(packed, 0, s, dt, name + ".dgate"), view(packed, n, s, dt, name + ".dup")};
}

std::vector<ValueId> Builder::attention_backward(ValueId q, ValueId k, ValueId v, ValueId key_mask, ValueId dy, double scale, bool causal,
                                                 const std::string& name) {
  const int64_t nq = shape_numel(shape(q)), nk = shape_numel(shape(k));
  const DType dt = node(dy).dtype;
  Node n = make_node(Op::AttentionBackward, {q, k, v, key_mask, dy}, {nq + 2 * nk}, dt, name);
  n.attrs.scale = scale;
  n.attrs.causal = causal;
  const ValueId packed = push(std::move(n));
  return {view(packed, 0, shape(q), dt, name + ".dq"), view(packed, nq, shape(k), dt, name + ".dk"),
          view(packed, nq + nk, shape(v), dt, name + ".dv")};
}

int64_t vocab_stats_numel(int64_t R, int64_t V, bool keep_logits) {
  return kVocabStatRows * R + (keep_logits ? (R * V + 1) / 2 : 0);
}

ValueId Builder::vocab_stats(ValueId h, ValueId w, ValueId targets, bool entropy, bool keep_logits, const std::string& name,
                             const VocabSplit& split) {
  check(h, "vocab_stats h");
  check(w, "vocab_stats w");
  const Shape& hs = shape(h);
  if (hs.empty() || shape(w).size() != 2 || shape(w)[1] != hs.back())
    fail("vocab_stats {}: h {} w {} do not fit (h:[...,C], w:[V,C])", name, shape_str(hs), shape_str(shape(w)));
  if (targets != kNone) {
    check(targets, "vocab_stats targets");
    if (shape(targets) != leading(hs) || node(targets).dtype != DType::I32)
      fail("vocab_stats {}: targets {} do not fit h {} (targets:[...] i32)", name, shape_str(shape(targets)), shape_str(hs));
  }
  if (keep_logits && (node(h).dtype != DType::BF16 || node(w).dtype != DType::BF16))
    fail("vocab_stats {}: keep_logits keeps bf16 logits, so h and w must be bf16 (they are {} and {})", name, dtype_name(node(h).dtype),
         dtype_name(node(w).dtype));
  const int64_t R = shape_numel(leading(hs)), V = shape(w)[0];
  check_split(split, V, true, "vocab_stats", name);
  Node n = make_node(Op::VocabStats, {h, w, targets}, {vocab_stats_numel(R, V, keep_logits)}, DType::F32, name);
  n.attrs.entropy = entropy;
  n.attrs.keep_logits = keep_logits;
  n.attrs.vocab = split;
  return push(std::move(n));
}

ValueId Builder::vocab_stat(ValueId stats, VocabStat which, const std::string& name) {
  check(stats, "vocab_stat stats");
  const Node& s = node(stats);
  if (s.op != Op::VocabStats) fail("vocab_stat {}: %{} is a {}, not a vocab_stats node", name, stats, op_name(s.op));
  const Shape lead = leading(shape(s.inputs[0]));
  return view(stats, static_cast<int64_t>(which) * shape_numel(lead), lead, DType::F32, name);
}

namespace {
// A backward node's `stats` input: a VocabStats node on the same (h, w), with the entropy row when it is needed.
void check_stats(const Graph& g, ValueId stats, ValueId h, ValueId w, bool need_entropy, const char* what, const std::string& name) {
  if (stats == kNone) return;
  const Node& s = g.node(stats);
  if (s.op != Op::VocabStats || s.inputs[0] != h || s.inputs[1] != w)
    fail("{} {}: stats %{} is not a vocab_stats node of the same h and w", what, name, stats);
  if (need_entropy && !s.attrs.entropy) fail("{} {}: stats %{} has no entropy row (vocab_stats without entropy)", what, name, stats);
}
}  // namespace

std::vector<ValueId> Builder::token_logprobs_backward(ValueId h, ValueId w, ValueId targets, ValueId dlogp, const std::string& name,
                                                      ValueId stats, const VocabSplit& split, bool with_dw) {
  if (stats != kNone) check(stats, "token_logprobs_backward stats");
  check_stats(graph_, stats, h, w, false, "token_logprobs_backward", name);
  check_split(split, shape(w)[0], true, "token_logprobs_backward", name);
  const int64_t nh = shape_numel(shape(h)), nw = with_dw ? shape_numel(shape(w)) : 0;
  const DType dt = node(dlogp).dtype;
  Node n = make_node(Op::TokenLogprobsBackward, {h, w, targets, dlogp, stats}, {nh + nw}, dt, name);
  n.attrs.vocab = split;
  n.attrs.dh_only = !with_dw;
  const ValueId packed = push(std::move(n));
  return {view(packed, 0, shape(h), dt, name + ".dh"), with_dw ? view(packed, nh, shape(w), dt, name + ".dw") : kNone};
}

std::vector<ValueId> Builder::entropy_backward(ValueId h, ValueId w, ValueId dent, const std::string& name, ValueId stats,
                                                const VocabSplit& split, bool with_dw) {
  if (stats != kNone) check(stats, "entropy_backward stats");
  check_stats(graph_, stats, h, w, true, "entropy_backward", name);
  check_split(split, shape(w)[0], true, "entropy_backward", name);
  const int64_t nh = shape_numel(shape(h)), nw = with_dw ? shape_numel(shape(w)) : 0;
  const DType dt = node(dent).dtype;
  Node n = make_node(Op::EntropyBackward, {h, w, dent, stats}, {nh + nw}, dt, name);
  n.attrs.vocab = split;
  n.attrs.dh_only = !with_dw;
  const ValueId packed = push(std::move(n));
  return {view(packed, 0, shape(h), dt, name + ".dh"), with_dw ? view(packed, nh, shape(w), dt, name + ".dw") : kNone};
}

namespace {
// The four operands of jsd and jsd_backward: h:[...,C], w:[V,C], ht:[...,Ct], wt:[V,Ct] with one vocabulary.
void check_jsd_operands(const Builder& b, ValueId h, ValueId w, ValueId ht, ValueId wt, const char* what, const std::string& name) {
  const Shape &hs = b.shape(h), &ws = b.shape(w), &ts = b.shape(ht), &vs = b.shape(wt);
  if (hs.empty() || ws.size() != 2 || ws[1] != hs.back())
    fail("{} {}: the student's h {} and w {} do not fit (h:[...,C], w:[V,C])", what, name, shape_str(hs), shape_str(ws));
  if (ts.empty() || vs.size() != 2 || vs[1] != ts.back())
    fail("{} {}: the teacher's ht {} and wt {} do not fit (ht:[...,Ct], wt:[V,Ct])", what, name, shape_str(ts), shape_str(vs));
  if (Shape(hs.begin(), hs.end() - 1) != Shape(ts.begin(), ts.end() - 1))
    fail("{} {}: the student's rows {} and the teacher's {} differ (h:[...,C], ht:[...,Ct])", what, name, shape_str(hs), shape_str(ts));
  if (ws[0] != vs[0])
    fail("{} {}: the student's vocabulary ({} rows of w) and the teacher's ({} rows of wt) differ: distillation compares the two "
         "next-token distributions token by token, so both models need the same vocabulary",
         what, name, ws[0], vs[0]);
}
}  // namespace

ValueId Builder::jsd(ValueId h, ValueId w, ValueId ht, ValueId wt, double beta, const std::string& name) {
  check(h, "jsd h");
  check(w, "jsd w");
  check(ht, "jsd ht");
  check(wt, "jsd wt");
  check_jsd_operands(*this, h, w, ht, wt, "jsd", name);
  if (!(beta >= 0 && beta <= 1)) fail("jsd {}: beta must be in [0, 1], got {}", name, beta);
  const Shape lead = leading(shape(h));
  const DType out = node(h).dtype == DType::F64 ? DType::F64 : DType::F32;
  Node n = make_node(Op::Jsd, {h, w, ht, wt}, {kJsdStatRows * shape_numel(lead)}, out, name);
  n.attrs.value = beta;
  const ValueId packed = push(std::move(n));
  return view(packed, 0, lead, out, name + ".value");
}

std::vector<ValueId> Builder::jsd_backward(ValueId h, ValueId w, ValueId ht, ValueId wt, ValueId djsd, ValueId stats, const std::string& name,
                                           bool with_dw) {
  check(djsd, "jsd_backward djsd");
  check(stats, "jsd_backward stats");
  check_jsd_operands(*this, h, w, ht, wt, "jsd_backward", name);
  const Node& s = node(stats);
  if (s.op != Op::Jsd || s.inputs != std::vector<ValueId>{h, w, ht, wt})
    fail("jsd_backward {}: stats %{} is not the jsd node of the same h, w, ht and wt", name, stats);
  if (shape(djsd) != leading(shape(h))) fail("jsd_backward {}: djsd {} does not fit h {}", name, shape_str(shape(djsd)), shape_str(shape(h)));
  const int64_t nh = shape_numel(shape(h)), nw = with_dw ? shape_numel(shape(w)) : 0;
  const DType dt = node(djsd).dtype;
  Node n = make_node(Op::JsdBackward, {h, w, ht, wt, djsd, stats}, {nh + nw}, dt, name);
  n.attrs.value = s.attrs.value;
  n.attrs.dh_only = !with_dw;
  const ValueId packed = push(std::move(n));
  return {view(packed, 0, shape(h), dt, name + ".dh"), with_dw ? view(packed, nh, shape(w), dt, name + ".dw") : kNone};
}

ValueId Builder::rope_inverse(ValueId dy, const Node& fwd, const std::string& name) {
  Node n = make_node(Op::Rope, {dy, fwd.inputs[1]}, shape(dy), node(dy).dtype, name);
  n.attrs = fwd.attrs;
  n.attrs.inverse = !fwd.attrs.inverse;
  return push(std::move(n));
}

void Builder::output(ValueId v, const std::string& name) {
  check(v, "output");
  if (!name.empty() && std::find(graph_.output_names.begin(), graph_.output_names.end(), name) != graph_.output_names.end())
    fail("graph builder: output '{}' declared twice", name);
  graph_.outputs.push_back(v);
  graph_.output_names.push_back(name);
}

void Builder::mark_seed(ValueId v) {
  check(v, "mark_seed");
  if (node(v).op != Op::Input) fail("graph builder: only an input can be a seed, not %{} ({})", v, op_name(node(v).op));
  if (std::find(graph_.seed_inputs.begin(), graph_.seed_inputs.end(), node(v).name) == graph_.seed_inputs.end())
    graph_.seed_inputs.push_back(node(v).name);
}

size_t Graph::output_index(const std::string& name) const {
  for (size_t i = 0; i < output_names.size(); ++i)
    if (output_names[i] == name) return i;
  std::string known;
  for (const std::string& n : output_names)
    if (!n.empty()) known += (known.empty() ? "" : ", ") + n;
  if (known.size() > 300) known = known.substr(0, 300) + ", ...";
  fail("graph has no output named '{}' (outputs: {})", name, known.empty() ? "none named" : known);
}

std::map<std::string, size_t> Graph::output_indices() const {
  std::map<std::string, size_t> out;
  for (size_t i = 0; i < output_names.size(); ++i)
    if (!output_names[i].empty()) out.emplace(output_names[i], i);
  return out;
}

}  // namespace trl::graph

#include "graph/graph.h"

#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

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
// FNV-1a over bytes; enough to key an in-memory cache (the compiler issue adds the on-disk key).
struct Hasher {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  template <typename T> void pod(const T& v) { bytes(&v, sizeof v); }
};
}  // namespace

uint64_t Graph::hash() const {
  Hasher h;
  for (const Node& n : nodes) {
    h.pod(n.op);
    h.pod(n.dtype);
    for (int64_t d : n.shape) h.pod(d);
    for (ValueId v : n.inputs) h.pod(v);
    if (n.op == Op::Input) h.bytes(n.name.data(), n.name.size());
    h.pod(n.attrs.eps);
    h.pod(n.attrs.scale);
    h.pod(n.attrs.causal);
    h.pod(n.attrs.rope_scaling);
    h.bytes(n.attrs.inv_freq.data(), n.attrs.inv_freq.size() * sizeof(float));
  }
  for (ValueId v : outputs) h.pod(v);
  return h.h;
}

ValueId Builder::push(Node node) {
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

ValueId Builder::embedding(ValueId ids, ValueId table, DType out, const std::string& name) {
  check(ids, "embedding ids");
  check(table, "embedding table");
  const Node& i = node(ids);
  const Node& t = node(table);
  if (i.dtype != DType::I32) fail("embedding {}: ids must be i32, got {}", name, dtype_name(i.dtype));
  if (t.shape.size() != 2) fail("embedding {}: table must be [V, C], got {}", name, shape_str(t.shape));
  Node n;
  n.op = Op::Embedding;
  n.inputs = {ids, table};
  n.shape = i.shape;
  n.shape.push_back(t.shape[1]);
  n.dtype = out;
  n.name = name;
  return push(std::move(n));
}

ValueId Builder::matmul(ValueId x, ValueId w, ValueId bias, DType out, const std::string& name) {
  check(x, "matmul x");
  check(w, "matmul w");
  const Node& a = node(x);
  const Node& b = node(w);
  if (a.shape.empty() || b.shape.size() != 2 || a.shape.back() != b.shape[1]) {
    fail("matmul {}: x {} and w {} do not fit (x:[...,K] times w:[N,K])", name, shape_str(a.shape), shape_str(b.shape));
  }
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

ValueId Builder::attention(ValueId q, ValueId k, ValueId v, ValueId key_mask, double scale, bool causal, const std::string& name) {
  check(q, "attention q");
  check(k, "attention k");
  check(v, "attention v");
  const Shape& qs = node(q).shape;
  const Shape& ks = node(k).shape;
  const Shape& vs = node(v).shape;
  if (qs.size() != 4 || ks.size() != 4 || vs != ks || qs[0] != ks[0] || qs[3] != ks[3] || ks[2] == 0 || qs[2] % ks[2] != 0) {
    fail("attention {}: q {} and k/v {} / {} must be [B,T,H,D] and [B,S,Hkv,D] with H a multiple of Hkv", name, shape_str(qs),
         shape_str(ks), shape_str(vs));
  }
  if (causal && qs[1] > ks[1]) fail("attention {}: causal attention needs T ({}) <= S ({})", name, qs[1], ks[1]);
  if (key_mask != kNone) {
    check(key_mask, "attention key_mask");
    const Node& m = node(key_mask);
    if (m.dtype != DType::I32 || m.shape != Shape{ks[0], ks[1]}) {
      fail("attention {}: key_mask must be i32 [B,S] = [{}, {}], got {} {}", name, ks[0], ks[1], dtype_name(m.dtype), shape_str(m.shape));
    }
  }
  Node n;
  n.op = Op::Attention;
  n.inputs = {q, k, v, key_mask};
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

void Builder::output(ValueId v) {
  check(v, "output");
  graph_.outputs.push_back(v);
}

}  // namespace trl::graph

// The graph IR: a topologically ordered list of nodes, each producing one typed value. A model is traced once
// per input shape into a Graph with concrete shapes; backends compile a Graph into a Program and run it many
// times. Weights are graph inputs (bound by name at run time), so a weight update never changes the graph.
//
// Ops are coarse (DESIGN.md §1). Shapes use the glossary B batch, T tokens, S key positions, C hidden,
// H heads, Hkv kv heads, D head dim, F ffn, V vocab.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace trl::graph {

enum class Op : uint8_t {
  Input,      // a data input or a parameter, bound by name at run time
  Embedding,  // ids:[B,T] i32, table:[V,C] -> [B,T,C]
  MatMul,     // x:[...,K], w:[N,K] (nn.Linear layout), optional bias:[N] -> [...,N]   y = x·wᵀ + b
  RmsNorm,    // x:[...,C], w:[C] -> [...,C]   (Transformers' order: normalise in f32, cast, then scale)
  Rope,       // x:[B,T,H,D], positions:[B,T] i32 -> [B,T,H,D]   rotate-half (GPT-NeoX) layout
  Attention,  // q:[B,T,H,D], k,v:[B,S,Hkv,D], optional key_mask:[B,S] i32 -> [B,T,H,D]
  SwiGLU,     // gate,up:[...,F] -> silu(gate)·up
  Add,        // a,b: same shape
  Cast,       // x -> x in another dtype
  Reshape,    // same elements, new shape
};

const char* op_name(Op op);

using ValueId = int32_t;  // index of the node that produces the value
constexpr ValueId kNone = -1;

struct Attrs {
  double eps = 0;                // RmsNorm
  double scale = 1;              // Attention: softmax scale
  bool causal = true;            // Attention: query t sees keys up to t + (S - T)
  std::vector<float> inv_freq;   // Rope: D/2 inverse frequencies (f32, as Transformers computes them)
  float rope_scaling = 1.0f;     // Rope: attention_scaling applied to cos and sin
};

struct Node {
  Op op = Op::Input;
  std::vector<ValueId> inputs;  // kNone marks an absent optional input
  Shape shape;
  DType dtype = DType::F32;
  std::string name;             // inputs: the binding name; others: a debug name such as "blk.3.attn_q"
  Attrs attrs;
};

struct Graph {
  std::vector<Node> nodes;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;

  const Node& node(ValueId v) const { return nodes.at(static_cast<size_t>(v)); }
  // One line per node: "%12 = matmul(%3, %7) [2, 5, 64] f32  blk.0.attn_q".
  std::string dump() const;
  // A hash of structure, shapes, dtypes and attributes (names of inputs included, debug names excluded).
  uint64_t hash() const;
};

// Builds a graph with shape inference; every misuse throws trl::Error naming the op and the shapes.
class Builder {
 public:
  ValueId input(const std::string& name, Shape shape, DType dtype);
  ValueId embedding(ValueId ids, ValueId table, DType out, const std::string& name = "");
  ValueId matmul(ValueId x, ValueId w, ValueId bias, DType out, const std::string& name = "");
  ValueId rms_norm(ValueId x, ValueId w, double eps, const std::string& name = "");
  ValueId rope(ValueId x, ValueId positions, std::vector<float> inv_freq, float scaling, const std::string& name = "");
  ValueId attention(ValueId q, ValueId k, ValueId v, ValueId key_mask, double scale, bool causal, const std::string& name = "");
  ValueId swiglu(ValueId gate, ValueId up, const std::string& name = "");
  ValueId add(ValueId a, ValueId b, const std::string& name = "");
  ValueId cast(ValueId x, DType out, const std::string& name = "");
  ValueId reshape(ValueId x, Shape shape, const std::string& name = "");
  void output(ValueId v);

  const Node& node(ValueId v) const { return graph_.node(v); }
  const Shape& shape(ValueId v) const { return graph_.node(v).shape; }
  Graph finish() { return std::move(graph_); }

 private:
  ValueId push(Node node);
  void check(ValueId v, const char* what) const;
  Graph graph_;
};

}  // namespace trl::graph

// Lowering on the CPU backend: each graph node becomes one kernel, a closure whose shapes, dtypes and oneDNN
// primitives are fixed at compile time and which reads its operands through the program's context while it runs.
// The op table (cpu_backend.cpp, `kLowerings`) maps every graph::Op to the function below that lowers it; the
// functions live in one file per op family (docs/ARCHITECTURE.md, "Adding an op"):
//
//   ops_memory.cpp      embedding, embedding_backward, cast, fill, slice, kv_cache_write
//   ops_elementwise.cpp add, scale_by, dropout, swiglu, swiglu_backward, weighted_sum, sum_rows
//   ops_matmul.cpp      matmul (GEMM or GEMV), matmul_nn, matmul_tn, batched_matmul
//   ops_norm.cpp        rms_norm, rms_norm_back_x, rms_norm_back_w
//   ops_rope.cpp        rope
//   ops_attention.cpp   attention (blocked, at cache positions), attention_backward
//   ops_vocab.cpp       vocab_stats (the fused pass over V), token_logprobs, entropy, token_argmax_match, backward
//   ops_distill.cpp     jsd, jsd_backward (generalized JSD of a student and a teacher head, chunked over V)
//   ops_collective.cpp  all_reduce, all_reduce_grad (tensor parallel)
//   ops_moe.cpp         moe_topk, moe_route_weights, moe_experts, moe_router_stats, moe_aux_loss and their backward
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trl/graph/graph.h"

namespace trl::cpu {

// The graph names every op file uses.
using graph::kNone;
using graph::Node;
using graph::Op;

using Kernel = std::function<void()>;
struct Arena;

// What lowering functions see of the program being compiled, and what its kernels read while it runs. A program
// owns its context and never moves, so kernels keep a pointer to it.
class ProgramContext {
 public:
  ProgramContext(const ProgramContext&) = delete;
  ProgramContext& operator=(const ProgramContext&) = delete;

  const graph::Graph& graph() const { return g_; }
  const graph::Node& nd(graph::ValueId v) const { return g_.node(v); }
  // The address of value v's data; valid inside a kernel (the program binds every value before it runs).
  void* p(graph::ValueId v) const { return ptr_[static_cast<size_t>(v)]; }
  // Whether node v writes into the buffer of one of its inputs (the planner decided so; see program.cpp).
  bool inplace(graph::ValueId v) const { return inplace_[static_cast<size_t>(v)]; }
  // Reserves `bytes` of the arena's scratch, after the planned buffers (64-byte aligned), for state a kernel keeps
  // between runs or hands to a later node of the same run; returns the offset to pass to scratch().
  size_t reserve_scratch(size_t bytes) {
    const size_t at = scratch_bytes_;
    scratch_bytes_ += (bytes + 63) / 64 * 64;
    return at;
  }
  char* scratch(size_t offset) const;
  // Working memory a kernel needs only while it runs, shared by every kernel of the program (sized to the largest
  // request; 64-byte aligned): a mixture-of-experts layer's tokens grouped by expert, for example.
  void reserve_transient(size_t bytes) { transient_bytes_ = std::max(transient_bytes_, (bytes + 63) / 64 * 64); }
  char* transient() const { return scratch(scratch_bytes_); }

 protected:
  explicit ProgramContext(graph::Graph g) : g_(std::move(g)) {}
  ~ProgramContext() = default;

  graph::Graph g_;
  std::vector<void*> ptr_;
  std::vector<bool> inplace_;
  std::shared_ptr<Arena> arena_;
  size_t arena_bytes_ = 0;    // the planned buffers
  size_t scratch_bytes_ = 0;  // kernels' own state, after the planned buffers
  size_t transient_bytes_ = 0;  // kernels' working memory while they run, after the scratch
};

// Lowers node `id` of c->graph(); a null Kernel means the node needs no work (aliases such as reshape).
using LowerFn = Kernel (*)(ProgramContext* c, graph::ValueId id);
// The op table's entry for `op` (never null: every op has one, checked at compile time).
LowerFn lowering(graph::Op op);

Kernel lower_alias(ProgramContext* c, graph::ValueId id);  // Input, Reshape, View
// ops_memory.cpp
Kernel lower_embedding(ProgramContext* c, graph::ValueId id);
Kernel lower_embedding_backward(ProgramContext* c, graph::ValueId id);
Kernel lower_cast(ProgramContext* c, graph::ValueId id);
Kernel lower_fill(ProgramContext* c, graph::ValueId id);
Kernel lower_slice(ProgramContext* c, graph::ValueId id);
Kernel lower_kv_cache_write(ProgramContext* c, graph::ValueId id);
// ops_elementwise.cpp
Kernel lower_add(ProgramContext* c, graph::ValueId id);
Kernel lower_scale_by(ProgramContext* c, graph::ValueId id);
Kernel lower_dropout(ProgramContext* c, graph::ValueId id);
Kernel lower_swiglu(ProgramContext* c, graph::ValueId id);
Kernel lower_swiglu_backward(ProgramContext* c, graph::ValueId id);
Kernel lower_weighted_sum(ProgramContext* c, graph::ValueId id);
Kernel lower_sum_rows(ProgramContext* c, graph::ValueId id);
// ops_matmul.cpp
Kernel lower_matmul(ProgramContext* c, graph::ValueId id);
Kernel lower_matmul_nn(ProgramContext* c, graph::ValueId id);
Kernel lower_matmul_tn(ProgramContext* c, graph::ValueId id);
Kernel lower_batched_matmul(ProgramContext* c, graph::ValueId id);
// ops_norm.cpp
Kernel lower_rms_norm(ProgramContext* c, graph::ValueId id);
Kernel lower_rms_norm_backward(ProgramContext* c, graph::ValueId id);  // RmsNormBackX and RmsNormBackW
// ops_rope.cpp
Kernel lower_rope(ProgramContext* c, graph::ValueId id);
// ops_attention.cpp
Kernel lower_attention(ProgramContext* c, graph::ValueId id);
Kernel lower_attention_backward(ProgramContext* c, graph::ValueId id);
// ops_vocab.cpp
Kernel lower_vocab_stats(ProgramContext* c, graph::ValueId id);
Kernel lower_vocab_forward(ProgramContext* c, graph::ValueId id);   // TokenLogprobs, Entropy, TokenArgmaxMatch
Kernel lower_vocab_backward(ProgramContext* c, graph::ValueId id);  // TokenLogprobsBackward, EntropyBackward
// ops_distill.cpp
Kernel lower_jsd(ProgramContext* c, graph::ValueId id);
Kernel lower_jsd_backward(ProgramContext* c, graph::ValueId id);
// ops_collective.cpp
Kernel lower_collective(ProgramContext* c, graph::ValueId id);  // AllReduce, AllReduceGrad
// ops_moe.cpp
Kernel lower_moe_router(ProgramContext* c, graph::ValueId id);  // MoeTopK, MoeRouteWeights(+Backward), MoeRouterStats(+Backward), MoeAuxLoss(+Backward)
Kernel lower_moe_experts(ProgramContext* c, graph::ValueId id);
Kernel lower_moe_experts_backward(ProgramContext* c, graph::ValueId id);

}  // namespace trl::cpu

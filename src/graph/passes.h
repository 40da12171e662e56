// Graph passes run by the backends before lowering.
#pragma once

#include "trl/graph/graph.h"

namespace trl::graph {

// Removes every node that no output depends on (inputs included: an unused input need not be bound). Node ids are
// renumbered; the order, and so the topological order, is kept.
Graph eliminate_dead_code(const Graph& g);

// Activation rematerialisation (`gradient_checkpointing`). The first `forward_nodes` nodes of `g` are the forward
// pass; nodes stamped with a segment (Builder::set_segment, one per decoder layer) may be recomputed. A segment's
// values read by another segment or by nodes outside any segment (the layer boundaries) stay in memory; every
// other forward value the backward pass reads is recomputed by a copy of its forward nodes, emitted just before the
// first backward node that needs it. The forward values then die within the forward pass, so the planner reuses
// their memory, and only one layer's activations are alive in the backward pass. Results are bit-identical.
Graph rematerialize(const Graph& g, size_t forward_nodes);

// The fused vocabulary pass. The forward vocabulary ops on one (h, w) — token_logprobs, entropy and
// token_argmax_match, with the same targets — become one vocab_stats node placed at the first of them, and each of
// them a View of its row: one lm_head GEMM pass over V instead of one per op. Their backward nodes
// (token_logprobs_backward, entropy_backward) on the same (h, w) get that node as their `stats` input, so they do not
// recompute the log-sum-exp and the entropy; for bf16 h and w the node also keeps the logits (exact: they are
// rounded to bf16 before the loss) and the backward reads them instead of recomputing the GEMM. Ops with f64
// results (the reference's finite differences) are left alone. Run by the compiled backends (see optimize()).
Graph fuse_vocabulary_ops(const Graph& g);

// The passes a compiling backend runs before lowering, in order: fuse_vocabulary_ops, eliminate_dead_code.
// (The reference backend runs only eliminate_dead_code: it executes the graph as written, the oracle the fused
// program is tested against.)
Graph optimize(const Graph& g);

}  // namespace trl::graph

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

}  // namespace trl::graph

// Graph passes run by the backends before lowering.
#pragma once

#include "graph/graph.h"

namespace trl::graph {

// Removes every node that no output depends on (inputs included: an unused input need not be bound). Node ids are
// renumbered; the order, and so the topological order, is kept.
Graph eliminate_dead_code(const Graph& g);

}  // namespace trl::graph

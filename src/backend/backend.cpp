#include "trl/backend/backend.h"

#include "trl/core/error.h"

namespace trl {

std::vector<Tensor> bind_inputs(const graph::Graph& graph, const TensorMap& inputs) {
  std::vector<Tensor> bound;
  bound.reserve(graph.inputs.size());
  for (graph::ValueId id : graph.inputs) {
    const graph::Node& n = graph.node(id);
    auto it = inputs.find(n.name);
    if (it == inputs.end()) fail("program input '{}' ({} {}) is not bound", n.name, dtype_name(n.dtype), shape_str(n.shape));
    const Tensor& t = it->second;
    if (t.dtype() != n.dtype || t.shape() != n.shape) {
      fail("program input '{}': expected {} {}, got {} {}", n.name, dtype_name(n.dtype), shape_str(n.shape), dtype_name(t.dtype()),
           shape_str(t.shape()));
    }
    if (!t.is_contiguous()) fail("program input '{}' must be contiguous", n.name);
    bound.push_back(t);
  }
  return bound;
}

}  // namespace trl

#include "trl/backend/backend.h"

#include <algorithm>

#include "trl/core/error.h"

namespace trl {

namespace {
Tensor bind_one(const graph::Node& n, const TensorMap& inputs) {
  auto it = inputs.find(n.name);
  if (it == inputs.end()) fail("program input '{}' ({} {}) is not bound", n.name, dtype_name(n.dtype), shape_str(n.shape));
  const Tensor& t = it->second;
  if (t.dtype() != n.dtype || t.shape() != n.shape) {
    fail("program input '{}': expected {} {}, got {} {}", n.name, dtype_name(n.dtype), shape_str(n.shape), dtype_name(t.dtype()),
         shape_str(t.shape()));
  }
  if (!t.is_contiguous()) fail("program input '{}' must be contiguous", n.name);
  return t;
}
}  // namespace

std::vector<Tensor> bind_inputs(const graph::Graph& graph, const TensorMap& inputs) {
  std::vector<Tensor> bound;
  bound.reserve(graph.inputs.size());
  for (graph::ValueId id : graph.inputs) bound.push_back(bind_one(graph.node(id), inputs));
  return bound;
}

std::vector<Tensor> bind_stage_inputs(const graph::Graph& graph, const TensorMap& inputs, int stage) {
  if (stage != 0 && stage != 1) fail("program stage {} does not exist (a two-stage program has stages 0 and 1)", stage);
  std::vector<Tensor> bound(graph.inputs.size());
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const graph::Node& n = graph.node(graph.inputs[i]);
    const bool seed = std::find(graph.seed_inputs.begin(), graph.seed_inputs.end(), n.name) != graph.seed_inputs.end();
    if (seed == (stage == 1)) bound[i] = bind_one(n, inputs);
  }
  return bound;
}

std::vector<Tensor> Program::run_stage(const TensorMap&, int) {
  fail("this backend's programs do not run in stages (Program::run_stage); use run() with every input bound");
}

}  // namespace trl

#include "graph/passes.h"

#include <functional>

#include "trl/core/error.h"

namespace trl::graph {

Graph eliminate_dead_code(const Graph& g) {
  const size_t n = g.nodes.size();
  std::vector<bool> live(n, false);
  for (ValueId o : g.outputs) live[static_cast<size_t>(o)] = true;
  for (size_t i = n; i-- > 0;) {
    if (!live[i]) continue;
    for (ValueId in : g.nodes[i].inputs)
      if (in != kNone) live[static_cast<size_t>(in)] = true;
  }
  std::vector<ValueId> remap(n, kNone);
  Graph out;
  for (size_t i = 0; i < n; ++i) {
    if (!live[i]) continue;
    Node node = g.nodes[i];
    for (ValueId& in : node.inputs)
      if (in != kNone) in = remap[static_cast<size_t>(in)];
    remap[i] = static_cast<ValueId>(out.nodes.size());
    out.nodes.push_back(std::move(node));
  }
  for (ValueId in : g.inputs)
    if (live[static_cast<size_t>(in)]) out.inputs.push_back(remap[static_cast<size_t>(in)]);
  for (ValueId o : g.outputs) out.outputs.push_back(remap[static_cast<size_t>(o)]);
  out.output_names = g.output_names;
  return out;
}

Graph rematerialize(const Graph& g, size_t forward_nodes) {
  const size_t n = g.nodes.size();
  if (forward_nodes > n) fail("rematerialize: {} forward nodes in a graph of {}", forward_nodes, n);
  // Boundary values stay in memory: those read across segments, and the outputs.
  std::vector<bool> kept(n, false);
  for (size_t i = 0; i < forward_nodes; ++i)
    for (ValueId in : g.nodes[i].inputs)
      if (in != kNone && g.node(in).segment >= 0 && g.node(in).segment != g.nodes[i].segment) kept[static_cast<size_t>(in)] = true;
  for (ValueId o : g.outputs) kept[static_cast<size_t>(o)] = true;
  auto recomputable = [&](ValueId v) {
    const Node& x = g.node(v);
    return static_cast<size_t>(v) < forward_nodes && x.segment >= 0 && x.op != Op::Input && !kept[static_cast<size_t>(v)];
  };
  Graph out;
  std::vector<ValueId> id_map(n, kNone), clone_of(n, kNone);
  auto emit = [&](Node node) {
    out.nodes.push_back(std::move(node));
    return static_cast<ValueId>(out.nodes.size() - 1);
  };
  // The recomputed copy of v (its inputs recomputed first, boundaries and parameters taken as they are).
  std::function<ValueId(ValueId)> recompute = [&](ValueId v) -> ValueId {
    if (!recomputable(v)) return id_map[static_cast<size_t>(v)];
    if (clone_of[static_cast<size_t>(v)] != kNone) return clone_of[static_cast<size_t>(v)];
    Node c = g.node(v);
    for (ValueId& in : c.inputs)
      if (in != kNone) in = recompute(in);
    c.name += ".remat";
    return clone_of[static_cast<size_t>(v)] = emit(std::move(c));
  };
  for (size_t i = 0; i < n; ++i) {
    Node c = g.nodes[i];
    for (ValueId& in : c.inputs)
      if (in != kNone) in = i < forward_nodes ? id_map[static_cast<size_t>(in)] : recompute(in);
    id_map[i] = emit(std::move(c));
  }
  for (ValueId in : g.inputs) out.inputs.push_back(id_map[static_cast<size_t>(in)]);
  for (ValueId o : g.outputs) out.outputs.push_back(id_map[static_cast<size_t>(o)]);
  out.output_names = g.output_names;
  return out;
}

}  // namespace trl::graph

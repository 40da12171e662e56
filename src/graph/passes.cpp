#include "graph/passes.h"

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
  return out;
}

}  // namespace trl::graph

#include "graph/passes.h"

#include <functional>
#include <map>
#include <utility>

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
  out.seed_inputs = g.seed_inputs;
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
  out.seed_inputs = g.seed_inputs;
  return out;
}

namespace {

bool vocab_forward(Op op) { return op == Op::TokenLogprobs || op == Op::Entropy || op == Op::TokenArgmaxMatch; }
bool vocab_backward(Op op) { return op == Op::TokenLogprobsBackward || op == Op::EntropyBackward; }

// One fused pass: the forward nodes it replaces, their targets, and what its backward nodes need.
struct VocabGroup {
  ValueId h, w, targets = kNone;
  size_t first;  // the node it is emitted before (the first member)
  bool entropy = false, keep_logits = false;
  ValueId fused = kNone;  // its id in the new graph
};

// Which row of the fused result a forward op reads.
VocabStat row_of(Op op) {
  return op == Op::TokenLogprobs ? VocabStat::Logprob : op == Op::Entropy ? VocabStat::Entropy : VocabStat::Match;
}

}  // namespace

Graph fuse_vocabulary_ops(const Graph& g) {
  const size_t n = g.nodes.size();
  // Phase 1: group the forward nodes by (h, w) and targets. A node with targets joins a group that has none only
  // when its targets exist before the group's first node (where the fused node goes).
  std::vector<VocabGroup> groups;
  std::vector<int> group_of(n, -1);  // forward members and backward users
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = g.nodes[i];
    if (!(vocab_forward(nd.op) || vocab_backward(nd.op)) || nd.dtype != DType::F32) continue;
    const ValueId h = nd.inputs[0], w = nd.inputs[1];
    if (vocab_backward(nd.op)) {  // the last group on (h, w) before it
      for (size_t k = groups.size(); k-- > 0;) {
        if (groups[k].h != h || groups[k].w != w) continue;
        group_of[i] = static_cast<int>(k);
        groups[k].entropy = groups[k].entropy || nd.op == Op::EntropyBackward;
        groups[k].keep_logits = g.node(h).dtype == DType::BF16 && g.node(w).dtype == DType::BF16;
        break;
      }
      continue;
    }
    const ValueId tg = nd.op == Op::Entropy ? kNone : nd.inputs[2];
    int found = -1;
    for (size_t k = 0; k < groups.size() && found < 0; ++k) {
      const VocabGroup& gr = groups[k];
      if (gr.h != h || gr.w != w) continue;
      if (tg == kNone || gr.targets == tg || (gr.targets == kNone && static_cast<size_t>(tg) < gr.first)) found = static_cast<int>(k);
    }
    if (found < 0) {
      groups.push_back(VocabGroup{h, w, tg, i});
      found = static_cast<int>(groups.size() - 1);
    }
    VocabGroup& gr = groups[static_cast<size_t>(found)];
    if (gr.targets == kNone) gr.targets = tg;
    gr.entropy = gr.entropy || nd.op == Op::Entropy;
    group_of[i] = found;
  }
  if (groups.empty()) return g;
  // Phase 2: emit the graph with each group's vocab_stats before its first member, members as Views of it, and
  // backward nodes reading it.
  Graph out;
  std::vector<ValueId> remap(n, kNone);
  std::vector<bool> is_output(n, false);
  for (ValueId o : g.outputs) is_output[static_cast<size_t>(o)] = true;
  auto emit = [&](Node node) {
    out.nodes.push_back(std::move(node));
    return static_cast<ValueId>(out.nodes.size() - 1);
  };
  for (size_t i = 0; i < n; ++i) {
    Node nd = g.nodes[i];
    for (ValueId& in : nd.inputs)
      if (in != kNone) in = remap[static_cast<size_t>(in)];
    if (group_of[i] < 0) {
      remap[i] = emit(std::move(nd));
      continue;
    }
    VocabGroup& gr = groups[static_cast<size_t>(group_of[i])];
    if (vocab_backward(nd.op)) {
      nd.inputs.resize(nd.op == Op::TokenLogprobsBackward ? 5 : 4, kNone);
      nd.inputs.back() = gr.fused;
      remap[i] = emit(std::move(nd));
      continue;
    }
    const Shape lead = nd.shape;
    const int64_t R = shape_numel(lead), V = g.node(gr.w).shape[0];
    if (i == gr.first) {
      Node f;
      f.op = Op::VocabStats;
      f.inputs = {remap[static_cast<size_t>(gr.h)], remap[static_cast<size_t>(gr.w)],
                  gr.targets == kNone ? kNone : remap[static_cast<size_t>(gr.targets)]};
      f.shape = {vocab_stats_numel(R, V, gr.keep_logits)};
      f.dtype = DType::F32;
      f.name = "vocab_stats." + nd.name;
      f.attrs.entropy = gr.entropy;
      f.attrs.keep_logits = gr.keep_logits;
      f.attrs.vocab = nd.attrs.vocab;  // the members of a group share (h, w) and so its split
      f.segment = nd.segment;
      gr.fused = emit(std::move(f));
    }
    Node v;
    v.op = Op::View;
    v.inputs = {gr.fused};
    v.shape = lead;
    v.dtype = DType::F32;
    v.name = nd.name;
    v.attrs.offset = static_cast<int64_t>(row_of(nd.op)) * R;
    v.segment = nd.segment;
    remap[i] = emit(std::move(v));
    if (gr.keep_logits && is_output[i]) {
      // An output row is copied out (R floats), so that the kept logits (R·V·2 bytes) need not outlive the
      // backward nodes that read them.
      Node copy;
      copy.op = Op::Cast;
      copy.inputs = {remap[i]};
      copy.shape = lead;
      copy.dtype = DType::F32;
      copy.name = nd.name + ".out";
      copy.segment = nd.segment;
      remap[i] = emit(std::move(copy));
    }
  }
  for (ValueId in : g.inputs) out.inputs.push_back(remap[static_cast<size_t>(in)]);
  for (ValueId o : g.outputs) out.outputs.push_back(remap[static_cast<size_t>(o)]);
  out.output_names = g.output_names;
  out.seed_inputs = g.seed_inputs;
  return out;
}

Graph optimize(const Graph& g) { return eliminate_dead_code(fuse_vocabulary_ops(g)); }

}  // namespace trl::graph

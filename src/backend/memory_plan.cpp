#include "backend/memory_plan.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>

namespace trl {

using graph::Node;
using graph::Op;

namespace {

// Nodes whose value is another node's buffer: views, the KV-cache write (it returns the cache it wrote into).
bool aliases_its_input(const Node& nd) { return nd.op == Op::Reshape || nd.op == Op::View || nd.op == Op::KvCacheWrite; }

// root[i]: the node whose buffer value i lives in; last[r]: the last node that reads root r (n: a graph output).
struct Liveness {
  std::vector<size_t> root, last;
  Liveness(const graph::Graph& g, const std::vector<bool>& inplace) : root(g.nodes.size()), last(g.nodes.size(), 0) {
    const size_t n = g.nodes.size();
    for (size_t i = 0; i < n; ++i) {
      const Node& nd = g.nodes[i];
      if (inplace[i]) root[i] = root[static_cast<size_t>(nd.inputs[static_cast<size_t>(graph::accumulate_input(nd))])];
      else root[i] = aliases_its_input(nd) ? root[static_cast<size_t>(nd.inputs[0])] : i;
    }
    for (size_t i = 0; i < n; ++i) {
      last[root[i]] = std::max(last[root[i]], i);
      for (graph::ValueId in : g.nodes[i].inputs)
        if (in != graph::kNone) last[root[static_cast<size_t>(in)]] = std::max(last[root[static_cast<size_t>(in)]], i);
    }
    for (graph::ValueId o : g.outputs) last[root[static_cast<size_t>(o)]] = n;
  }
};

constexpr const char* kMagic = "trl-plan 4";  // 4: the planner left the CPU backend (3: in-place GEMM addends)

}  // namespace

size_t value_bytes(const Node& node) { return static_cast<size_t>(shape_numel(node.shape)) * dtype_size(node.dtype); }

MemoryPlan MemoryPlan::make(const graph::Graph& g) {
  const size_t n = g.nodes.size();
  MemoryPlan plan;
  plan.inplace.assign(n, false);
  Liveness live(g, plan.inplace);
  // In-place update: an op that adds into one of its inputs (graph::accumulate_input: the scatter-add of a tied
  // embedding's gradient into the head's, a GEMM into its addend) writes over that input's buffer when nothing
  // reads it afterwards, instead of copying it first.
  bool any_inplace = false;
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = g.nodes[i];
    const int k = graph::accumulate_input(nd);
    if (k < 0) continue;
    const size_t base = static_cast<size_t>(nd.inputs[static_cast<size_t>(k)]);
    if (g.nodes[base].dtype == nd.dtype && g.nodes[live.root[base]].op != Op::Input && live.last[live.root[base]] == i)
      plan.inplace[i] = any_inplace = true;
  }
  if (any_inplace) live = Liveness(g, plan.inplace);

  // Best fit among the freed blocks (splitting off a remainder over 4 KiB), else the top of the block.
  struct Block {
    size_t offset, size;
  };
  std::vector<Block> free_blocks;
  std::vector<std::pair<size_t, Block>> held;  // (last use, block)
  plan.offsets.assign(n, kNone);
  size_t top = 0;
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < held.size();) {  // release the buffers whose last reader ran before this node
      if (held[k].first < i) {
        free_blocks.push_back(held[k].second);
        held[k] = held.back();
        held.pop_back();
      } else {
        ++k;
      }
    }
    const Node& nd = g.nodes[i];
    if (nd.op == Op::Input || live.root[i] != i) continue;
    const size_t bytes = (value_bytes(nd) + kAlign - 1) / kAlign * kAlign + kGuardBytes;
    size_t best = kNone;
    for (size_t k = 0; k < free_blocks.size(); ++k)
      if (free_blocks[k].size >= bytes && (best == kNone || free_blocks[k].size < free_blocks[best].size)) best = k;
    Block b;
    if (best != kNone) {
      b = free_blocks[best];
      free_blocks.erase(free_blocks.begin() + static_cast<std::ptrdiff_t>(best));
      if (b.size > bytes + 4096) free_blocks.push_back({b.offset + bytes, b.size - bytes}), b.size = bytes;
    } else {
      b = {top, bytes};
      top += bytes;
    }
    plan.offsets[i] = b.offset;
    held.emplace_back(live.last[i], b);
  }
  plan.bytes = top;
  return plan;
}

std::string MemoryPlan::to_text() const {
  std::string out = fmt::format("{} {} {}\n", kMagic, offsets.size(), bytes);
  for (size_t i = 0; i < offsets.size(); ++i)
    out += offsets[i] == kNone ? fmt::format("- {}\n", inplace[i] ? 1 : 0) : fmt::format("{} {}\n", offsets[i], inplace[i] ? 1 : 0);
  return out;
}

std::optional<MemoryPlan> MemoryPlan::from_text(const graph::Graph& g, const std::string& text) {
  std::istringstream in(text);
  std::string magic1, magic2;
  size_t n = 0, block = 0;
  if (!(in >> magic1 >> magic2 >> n >> block) || magic1 + " " + magic2 != kMagic || n != g.nodes.size()) return std::nullopt;
  MemoryPlan plan;
  plan.offsets.assign(n, kNone);
  plan.inplace.assign(n, false);
  plan.bytes = block;
  for (size_t i = 0; i < n; ++i) {
    std::string off;
    int ip = 0;
    if (!(in >> off >> ip) || (ip != 0 && ip != 1)) return std::nullopt;
    const Node& nd = g.nodes[i];
    const bool alias = nd.op == Op::Input || aliases_its_input(nd) || ip == 1;
    if (ip == 1 && graph::accumulate_input(nd) < 0) return std::nullopt;
    if (off == "-") {
      if (!alias) return std::nullopt;
    } else {
      if (alias) return std::nullopt;
      char* end = nullptr;
      const unsigned long long v = std::strtoull(off.c_str(), &end, 10);
      if (end == off.c_str() || *end != '\0' || v + value_bytes(nd) + kGuardBytes > block) return std::nullopt;
      plan.offsets[i] = static_cast<size_t>(v);
    }
    plan.inplace[i] = ip == 1;
  }
  return plan;
}

}  // namespace trl

// The backend-neutral memory planner (src/backend/memory_plan.h): values alive at the same time never share bytes,
// freed blocks are reused, and a plan read back from text is the plan, or refused when it does not fit the graph.
#include "backend/memory_plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trl/graph/graph.h"

namespace trl {
namespace {

// A chain of 8 adds over [64, 64] f32 values, each also reading the input (no views, nothing in place): value i is
// alive from its node to its last reader, the last one to the end (an output).
graph::Graph chain(int links) {
  graph::Builder b;
  const auto x = b.input("x", {64, 64}, DType::F32);
  graph::ValueId v = x;
  for (int i = 0; i < links; ++i) v = b.add(v, x);
  b.output(v);
  return b.finish();
}

// [first, last] node indices during which each planned value must keep its bytes, from the graph alone.
std::vector<std::pair<size_t, size_t>> live_ranges(const graph::Graph& g) {
  std::vector<std::pair<size_t, size_t>> r(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) r[i] = {i, i};
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (graph::ValueId in : g.nodes[i].inputs)
      if (in != graph::kNone) r[static_cast<size_t>(in)].second = std::max(r[static_cast<size_t>(in)].second, i);
  for (graph::ValueId o : g.outputs) r[static_cast<size_t>(o)].second = g.nodes.size();
  return r;
}

TEST(MemoryPlan, ValuesAliveTogetherNeverShareBytesAndFreedBlocksAreReused) {
  const graph::Graph g = chain(8);
  const MemoryPlan p = MemoryPlan::make(g);
  ASSERT_EQ(p.offsets.size(), g.nodes.size());
  const auto live = live_ranges(g);
  const size_t one = 64 * 64 * 4 + MemoryPlan::kGuardBytes;  // each value's bytes and its guard
  size_t planned = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].op == graph::Op::Input) {
      EXPECT_EQ(p.offsets[i], MemoryPlan::kNone) << "an input lives in the caller's memory";
      continue;
    }
    ASSERT_NE(p.offsets[i], MemoryPlan::kNone) << i;
    EXPECT_EQ(p.offsets[i] % MemoryPlan::kAlign, 0u) << i;
    EXPECT_LE(p.offsets[i] + one, p.bytes) << i;
    ++planned;
    for (size_t j = 0; j < i; ++j) {
      if (p.offsets[j] == MemoryPlan::kNone) continue;
      const bool together = live[j].second >= i;  // j is still read at or after i's node
      const bool overlap = p.offsets[i] < p.offsets[j] + one && p.offsets[j] < p.offsets[i] + one;
      EXPECT_FALSE(together && overlap) << "values " << j << " and " << i << " are alive together in the same bytes";
    }
  }
  EXPECT_EQ(planned, 8u);
  // Each add reads the one before it: two values are alive at once, so two blocks serve all eight.
  EXPECT_EQ(p.bytes, 2 * one);
}

TEST(MemoryPlan, TextRoundTripsAndAPlanThatDoesNotFitIsRefused) {
  const graph::Graph g = chain(3);
  const MemoryPlan p = MemoryPlan::make(g);
  const auto back = MemoryPlan::from_text(g, p.to_text());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->offsets, p.offsets);
  EXPECT_EQ(back->inplace, p.inplace);
  EXPECT_EQ(back->bytes, p.bytes);
  // Another graph's node count, a buffer past the block, a buffer for an input, no buffer for a value, in place
  // where the op has no accumulate input, garbage.
  EXPECT_FALSE(MemoryPlan::from_text(chain(4), p.to_text()).has_value());
  const std::string text = p.to_text();
  // `text` with the first `from` (which must be there) replaced by `to`.
  auto edited = [&](const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? text : text.substr(0, at) + to + text.substr(at + from.size());
  };
  const std::string first_value = fmt::format("\n{} 0\n", p.offsets[1]);  // node 1, the first add
  const std::string shrunk = fmt::format("trl-plan 4 {} 64\n", g.nodes.size());
  EXPECT_FALSE(MemoryPlan::from_text(g, shrunk + text.substr(text.find('\n') + 1)).has_value());
  EXPECT_FALSE(MemoryPlan::from_text(g, edited("\n- 0\n", "\n0 0\n")).has_value());  // the input given a buffer
  EXPECT_FALSE(MemoryPlan::from_text(g, edited(first_value, "\n- 0\n")).has_value());
  EXPECT_FALSE(MemoryPlan::from_text(g, edited(first_value, "\n- 1\n")).has_value());
  EXPECT_FALSE(MemoryPlan::from_text(g, "trl-plan 4 4 banana").has_value());
  EXPECT_FALSE(MemoryPlan::from_text(g, "").has_value());
}

}  // namespace
}  // namespace trl

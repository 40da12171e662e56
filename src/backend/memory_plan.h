// Where a program's values live: a graph's buffers planned into one block of working memory, for any backend (the
// CPU's arena; a device's pool). Liveness over the node order, best-fit reuse of the blocks whose last reader has
// run, and in-place accumulation where nothing reads the overwritten input afterwards. The plan is the offsets;
// the memory belongs to the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trl/graph/graph.h"

namespace trl {

struct MemoryPlan {
  static constexpr size_t kNone = SIZE_MAX;
  // Buffers start on 64-byte boundaries and are followed by at least kGuardBytes of padding (the CPU backend's
  // TRL_CHECK_GUARDS fills and checks it).
  static constexpr size_t kAlign = 64;
  static constexpr size_t kGuardBytes = 64;

  std::vector<size_t> offsets;  // per node: its buffer's offset in the block; kNone for inputs and aliases
  std::vector<bool> inplace;    // per node: writes over the buffer of its graph::accumulate_input
  size_t bytes = 0;             // the block's size

  // Plans `g` anew.
  static MemoryPlan make(const graph::Graph& g);
  // The plan as text, for the program cache's disk files: a header line, then "offset inplace" per node.
  std::string to_text() const;
  // A to_text() of a plan for `g`, checked to fit it: the node count, every buffer inside the block, buffers exactly
  // for the nodes that need one, in place only where the op allows. Anything else: nullopt (plan anew).
  static std::optional<MemoryPlan> from_text(const graph::Graph& g, const std::string& text);
};

// The bytes of node i's data (its shape times its dtype's size), without alignment or guard.
size_t value_bytes(const graph::Node& node);

}  // namespace trl

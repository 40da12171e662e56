// Programs compiled per shape, cached: the Neuron-style compile cache of DESIGN.md §1. A lookup hashes the graph
// (structure, shapes, dtypes, attributes) together with the backend; a miss compiles, counts and times it. With
// TRL_LOG_RECOMPILES=1 every miss prints which input shape differs from the closest cached program.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "backend/backend.h"

namespace trl {

struct ProgramCacheStats {
  int64_t compilations = 0;
  int64_t hits = 0;
  double compile_seconds = 0;
};

class ProgramCache {
 public:
  explicit ProgramCache(Backend& backend, size_t capacity = 64) : backend_(backend), capacity_(capacity) {}
  // The compiled program for `graph` (compiling it on a miss). The reference stays valid until it is evicted.
  Program& get(const graph::Graph& graph);
  const ProgramCacheStats& stats() const { return stats_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t key;
    std::map<std::string, Shape> input_shapes;
    std::unique_ptr<Program> program;
    int64_t number;
  };
  void log_miss(const graph::Graph& graph, const std::map<std::string, Shape>& shapes) const;

  Backend& backend_;
  size_t capacity_;
  std::list<Entry> entries_;  // most recently used first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
  ProgramCacheStats stats_;
};

}  // namespace trl

// Programs compiled per shape, cached: the Neuron-style compile cache (docs/COMPILER.md, "The program cache"). A lookup hashes the graph
// (structure, shapes, dtypes, attributes) together with the backend, and a hit compares the graph's full key (so a
// 64-bit collision can never run the wrong program); a miss compiles, counts and times it. With
// TRL_LOG_RECOMPILES=1 every miss prints which input shape differs from the closest cached program.
// With a disk directory, a miss first looks for the backend's plan of the same key on disk (written after every
// fresh compile, atomically) and compiles with it; plans that do not fit are ignored with a warning.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "trl/backend/backend.h"

namespace trl {

struct ProgramCacheStats {
  int64_t compilations = 0;   // misses: programs built (from scratch or from a plan on disk)
  int64_t hits = 0;           // lookups answered from memory
  int64_t disk_hits = 0;      // compilations that reused a plan from the disk cache
  int64_t disk_writes = 0;    // plans written to the disk cache
  double compile_seconds = 0;
};

struct ProgramCacheOptions {
  size_t capacity = 64;   // programs kept in memory (least recently used evicted)
  std::string disk_dir;   // where plans are kept across runs ("" = memory only); see default_program_cache_dir()
};

// $TRL_CACHE_DIR/programs (runtime::cache_dir()), or "" when TRL_DISK_CACHE=0.
std::string default_program_cache_dir();

class ProgramCache {
 public:
  explicit ProgramCache(Backend& backend, size_t capacity = 64) : backend_(backend), capacity_(capacity) {}
  Backend& backend() const { return backend_; }
  ProgramCache(Backend& backend, ProgramCacheOptions options)
      : backend_(backend), capacity_(options.capacity), disk_dir_(std::move(options.disk_dir)) {}
  // The compiled program for `graph` (compiling it on a miss). The reference stays valid until it is evicted.
  Program& get(const graph::Graph& graph);
  // The cache key of `graph` on this cache's backend, and the file its plan is kept in (when a disk dir is set).
  uint64_t key(const graph::Graph& graph) const;
  std::string plan_path(uint64_t key) const;
  const ProgramCacheStats& stats() const { return stats_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t key;
    std::string graph_key;  // graph::Graph::key(): a hit compares it in full, not only the 64-bit key
    std::map<std::string, Shape> input_shapes;
    std::unique_ptr<Program> program;
    int64_t number;
  };
  void log_miss(const graph::Graph& graph, const std::map<std::string, Shape>& shapes) const;

  Backend& backend_;
  size_t capacity_;
  std::string disk_dir_;
  std::list<Entry> entries_;  // most recently used first
  std::unordered_multimap<uint64_t, std::list<Entry>::iterator> index_;
  ProgramCacheStats stats_;
};

}  // namespace trl

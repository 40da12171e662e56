#include "backend/program_cache.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

namespace trl {

Program& ProgramCache::get(const graph::Graph& graph) {
  const uint64_t key = graph.hash() ^ (std::hash<std::string>{}(backend_.name()) * 0x9e3779b97f4a7c15ull);
  auto it = index_.find(key);
  if (it != index_.end()) {
    ++stats_.hits;
    entries_.splice(entries_.begin(), entries_, it->second);  // now most recently used
    return *entries_.front().program;
  }
  std::map<std::string, Shape> shapes;
  for (graph::ValueId v : graph.inputs) shapes[graph.node(v).name] = graph.node(v).shape;
  const char* log = std::getenv("TRL_LOG_RECOMPILES");
  if (log != nullptr && std::string(log) == "1") log_miss(graph, shapes);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Program> program = backend_.compile(graph);
  stats_.compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.compilations;
  entries_.push_front(Entry{key, std::move(shapes), std::move(program), stats_.compilations});
  index_[key] = entries_.begin();
  if (entries_.size() > capacity_) {
    index_.erase(entries_.back().key);
    entries_.pop_back();
  }
  return *entries_.front().program;
}

void ProgramCache::log_miss(const graph::Graph& graph, const std::map<std::string, Shape>& shapes) const {
  std::string msg = fmt::format("[trl] compiling program #{} on {} ({} nodes)", stats_.compilations + 1, backend_.name(), graph.nodes.size());
  const Entry* closest = nullptr;
  int best = -1;
  std::string best_diff;
  for (const Entry& e : entries_) {
    int differing = 0;
    std::string diff;
    for (const auto& [name, shape] : shapes) {
      auto f = e.input_shapes.find(name);
      if (f == e.input_shapes.end()) {
        ++differing;
        diff += fmt::format("; new input '{}'", name);
      } else if (f->second != shape) {
        ++differing;
        diff += fmt::format("; input '{}' is {} (cached: {})", name, shape_str(shape), shape_str(f->second));
      }
    }
    if (best < 0 || differing < best) best = differing, closest = &e, best_diff = diff;
  }
  if (closest == nullptr) msg += ": first program";
  else if (best == 0) msg += fmt::format(": same input shapes as program #{}, the graph or its options differ", closest->number);
  else msg += fmt::format(": closest cached program #{}{}", closest->number, best_diff);
  std::fprintf(stderr, "%s\n", msg.c_str());
}

}  // namespace trl

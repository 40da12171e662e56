#include "trl/backend/program_cache.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include <fmt/format.h>

#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/runtime/runtime.h"

namespace trl {

std::string default_program_cache_dir() {
  if (const char* v = std::getenv("TRL_DISK_CACHE"); v != nullptr && std::string(v) == "0") return {};
  return (std::filesystem::path(cache_dir()) / "programs").string();
}

uint64_t ProgramCache::key(const graph::Graph& graph) const {
  // FNV-1a of the backend's name, so the key is the same in every run (std::hash need not be).
  uint64_t h = 1469598103934665603ull;
  for (char c : backend_.name()) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return graph.hash() ^ (h * 0x9e3779b97f4a7c15ull);
}

std::string ProgramCache::plan_path(uint64_t key) const {
  if (disk_dir_.empty()) return {};
  return (std::filesystem::path(disk_dir_) / fmt::format("{}-{:016x}.plan", backend_.name(), key)).string();
}

namespace {
// A plan file starts with a line naming the graph it was made for (an independent digest of the full key and its
// length), so that a file whose name collides with another graph's is never used for it.
std::string plan_header(const std::string& graph_key) {
  return fmt::format("trl-plan-graph {:016x} {}\n", graph::hash_key(graph_key, 0x5eed), graph_key.size());
}
}  // namespace

Program& ProgramCache::get(const graph::Graph& graph) {
  const uint64_t key = this->key(graph);
  std::string graph_key = graph.key();
  for (auto [it, end] = index_.equal_range(key); it != end; ++it) {
    if (it->second->graph_key != graph_key) continue;  // a 64-bit collision: another graph
    ++stats_.hits;
    entries_.splice(entries_.begin(), entries_, it->second);  // now most recently used
    return *entries_.front().program;
  }
  std::map<std::string, Shape> shapes;
  for (graph::ValueId v : graph.inputs) shapes[graph.node(v).name] = graph.node(v).shape;
  const char* log = std::getenv("TRL_LOG_RECOMPILES");
  if (log != nullptr && std::string(log) == "1") log_miss(graph, shapes);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Program> program;
  bool from_disk = false;
  const std::string path = plan_path(key);
  if (!path.empty() && std::filesystem::exists(path)) {
    bool used = false;
    try {
      const std::string file = read_text_file(path), header = plan_header(graph_key);
      if (file.compare(0, header.size(), header) == 0) program = backend_.compile_with_plan(graph, file.substr(header.size()), &used);
      else program = backend_.compile(graph);  // a plan for another graph (or an older format): not used
    } catch (const Error& e) {
      std::fprintf(stderr, "[trl] warning: cannot read the cached plan %s: %s\n", path.c_str(), e.what());
    }
    from_disk = program && used;
    if (from_disk) ++stats_.disk_hits;
    else if (program) std::fprintf(stderr, "[trl] warning: the cached plan %s does not fit its graph; planned anew\n", path.c_str());
  }
  if (!program) program = backend_.compile(graph);
  if (!path.empty() && !from_disk) {  // a new plan, or one that replaces an unusable file
    const std::string blob = program->plan_blob();
    if (!blob.empty()) {
      try {
        std::error_code ec;
        std::filesystem::create_directories(disk_dir_, ec);
        write_text_file_atomic(path, plan_header(graph_key) + blob);
        ++stats_.disk_writes;
      } catch (const Error& e) {
        std::fprintf(stderr, "[trl] warning: cannot write the plan cache %s: %s\n", path.c_str(), e.what());
      }
    }
  }
  stats_.compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.compilations;
  entries_.push_front(Entry{key, std::move(graph_key), std::move(shapes), std::move(program), stats_.compilations});
  index_.emplace(key, entries_.begin());
  if (entries_.size() > capacity_) {
    const auto last = std::prev(entries_.end());
    for (auto [it, end] = index_.equal_range(last->key); it != end; ++it)
      if (it->second == last) {
        index_.erase(it);
        break;
      }
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

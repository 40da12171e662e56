#include "backend/cpu/program.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "trl/core/error.h"

namespace trl::cpu {

void Arena::reserve(size_t need) {
  if (keepalive && bytes >= need) return;
  // If the new buffer cannot be had, the arena is left empty with a new version: no program runs on the released
  // buffer, and the next run() reserves what it needs again.
  buffer = Tensor();
  keepalive.reset();
  bytes = 0;
  ++version;
  buffer = Tensor::uninitialized(DType::I32, {static_cast<int64_t>((need + 3) / 4 + 16)});
  keepalive = std::make_shared<Tensor>(buffer);
  bytes = need;
  ++version;
}

char* ProgramContext::scratch(size_t offset) const {
  return static_cast<char*>(arena_->buffer.mutable_data()) + arena_bytes_ + offset;
}

ThreadScope::ThreadScope(int threads) : saved_(omp_get_max_threads()) {
  if (threads > 0 && threads != saved_) omp_set_num_threads(threads);
}
ThreadScope::~ThreadScope() {
  if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
}

CpuProgram::CpuProgram(graph::Graph g, const ProgramOptions& options, std::shared_ptr<Arena> arena, const std::string* cached_plan, bool* used)
    : ProgramContext(std::move(g)), options_(options) {
  ThreadScope threads(options_.num_threads);  // oneDNN sizes its primitives for the threads they will run on
  arena_ = arena ? std::move(arena) : std::make_shared<Arena>();
  stage_boundary_ = graph::stage_boundary(g_);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<MemoryPlan> cached = cached_plan != nullptr ? MemoryPlan::from_text(g_, *cached_plan) : std::nullopt;
  if (used) *used = cached.has_value();
  plan_ = cached ? std::move(*cached) : MemoryPlan::make(g_);
  inplace_ = plan_.inplace;
  arena_bytes_ = plan_.bytes;
  ptr_.assign(g_.nodes.size(), nullptr);
  // Compiling allocates nothing: the arena (planned buffers, then the scratch lowering asks for) is reserved by the
  // first run, so `trl compile` and the Trainer's memory check can plan programs larger than the machine. The
  // kernels read their buffers' addresses at run time (ProgramContext::p).
  lower_all();
  compile_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

CpuProgram::~CpuProgram() {
  if (!options_.profile) return;
  std::fprintf(stderr, "[trl profile] seconds per op kind over all runs of this program:\n");
  for (size_t k = 0; k < op_seconds_.size(); ++k)
    if (op_seconds_[k] > 0) std::fprintf(stderr, "  %-24s %8.3f\n", graph::op_name(static_cast<Op>(k)), op_seconds_[k]);
}

// One kernel per node, through the op table; an error names the node being lowered.
void CpuProgram::lower_all() {
  kernels_.reserve(g_.nodes.size());
  for (size_t i = 0; i < g_.nodes.size(); ++i) {
    const Node& n = g_.nodes[i];
    try {
      kernels_.push_back(lowering(n.op)(this, static_cast<graph::ValueId>(i)));
    } catch (const Error& e) {
      fail("cpu backend: lowering node %{} ({} '{}'): {}", i, graph::op_name(n.op), n.name, e.what());
    }
  }
}

void CpuProgram::execute(const std::vector<Tensor>& bound, size_t begin, size_t end) {
  arena_->reserve(arena_bytes_ + scratch_bytes_ + transient_bytes_);  // the first run of a program (or after a failed allocation); else a no-op
  if (bound_version_ != arena_->version) bind_arena();
  for (size_t i = 0; i < g_.inputs.size(); ++i)
    if (bound[i].defined() && bound[i].data() != nullptr) ptr_[static_cast<size_t>(g_.inputs[i])] = const_cast<void*>(bound[i].data());
  for (size_t i = begin; i < end; ++i) {
    const Node& n = g_.nodes[i];
    if (n.op == Op::Reshape || n.op == Op::View) {
      ptr_[i] = static_cast<char*>(ptr_[static_cast<size_t>(n.inputs[0])]) + (n.op == Op::View ? n.attrs.offset * static_cast<int64_t>(dtype_size(n.dtype)) : 0);
    } else if (inplace_[i]) {
      ptr_[i] = ptr_[static_cast<size_t>(n.inputs[static_cast<size_t>(graph::accumulate_input(n))])];
    } else if (n.op == Op::KvCacheWrite) {  // the static cache is updated in the bound tensor itself
      ptr_[i] = ptr_[static_cast<size_t>(n.inputs[0])];
    }
    if (kernels_[i]) {
      if (options_.check_guards) fill_guard(i);
      const auto t0 = options_.profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      kernels_[i]();
      if (options_.profile) op_seconds_[static_cast<size_t>(n.op)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (options_.check_guards) verify_guard(i);
    }
  }
  ++arena_->runs;
  arena_->last_runner = this;
}

std::vector<Tensor> CpuProgram::run(const TensorMap& inputs) {
  ThreadScope threads(options_.num_threads);
  const std::vector<Tensor> bound = bind_inputs(g_, inputs);
  stage0_run_ = 0;
  staged_.clear();
  execute(bound, 0, g_.nodes.size());
  // Outputs are views into the arena (no copy): valid until this program runs again (clone() to keep one).
  return outputs(bound);
}

std::vector<Tensor> CpuProgram::run_stage(const TensorMap& inputs, int stage) {
  ThreadScope threads(options_.num_threads);
  std::vector<Tensor> part = bind_stage_inputs(g_, inputs, stage);
  if (stage == 0) {
    staged_ = std::move(part);
    execute(staged_, 0, stage_boundary_);
    stage0_run_ = arena_->runs;
    return outputs(staged_, stage_boundary_);
  }
  if (stage0_run_ == 0) fail("cpu backend: stage 1 of a two-stage program needs its stage 0 first (Program::run_stage)");
  if (arena_->runs != stage0_run_ || arena_->last_runner != this) {
    stage0_run_ = 0;
    fail("cpu backend: another program ran on this program's arena between its stage 0 and stage 1, so stage 0's "
         "values are gone; run the other program before stage 0 or after stage 1, or give it a backend of its own");
  }
  for (size_t i = 0; i < part.size(); ++i)
    if (part[i].defined() && part[i].data() != nullptr) staged_[i] = part[i];
  execute(staged_, stage_boundary_, g_.nodes.size());
  stage0_run_ = 0;
  return outputs(staged_);
}

std::vector<Tensor> CpuProgram::outputs(const std::vector<Tensor>& bound, size_t end) {
  std::vector<Tensor> out;
  for (graph::ValueId v : g_.outputs) {
    const Node& n = g_.node(v);
    if (n.op == Op::Input) {
      out.push_back(bound[static_cast<size_t>(std::find(g_.inputs.begin(), g_.inputs.end(), v) - g_.inputs.begin())]);
      continue;
    }
    if (static_cast<size_t>(v) >= end) {
      out.emplace_back();
      continue;
    }
    out.push_back(Tensor::view(ptr_[static_cast<size_t>(v)], n.dtype, n.shape, arena_->keepalive, StorageKind::View));
  }
  return out;
}

std::string CpuProgram::plan_blob() const { return plan_.to_text(); }

void CpuProgram::bind_arena() {
  if (arena_->bytes == 0) return;  // nothing reserved yet (a program compiled, never run)
  char* base = static_cast<char*>(arena_->buffer.mutable_data());
  for (size_t i = 0; i < ptr_.size(); ++i)
    if (plan_.offsets[i] != MemoryPlan::kNone) ptr_[i] = base + plan_.offsets[i];
  bound_version_ = arena_->version;
}

// Every buffer is followed by at least 64 bytes of padding. With TRL_CHECK_GUARDS=1 the padding is filled with
// a pattern before each node runs and checked after it, so a kernel writing past its output is caught by name.
void CpuProgram::fill_guard(size_t i) {
  if (plan_.offsets[i] != MemoryPlan::kNone) std::memset(static_cast<char*>(ptr_[i]) + value_bytes(g_.nodes[i]), 0xAB, MemoryPlan::kGuardBytes);
}
void CpuProgram::verify_guard(size_t i) const {
  if (plan_.offsets[i] == MemoryPlan::kNone) return;
  const unsigned char* g = static_cast<const unsigned char*>(ptr_[i]) + value_bytes(g_.nodes[i]);
  for (size_t k = 0; k < MemoryPlan::kGuardBytes; ++k)
    if (g[k] != 0xAB) fail("cpu backend: node %{} ({} '{}') wrote past the end of its output", i, graph::op_name(g_.nodes[i].op), g_.nodes[i].name);
}

}  // namespace trl::cpu

// A compiled CPU program: the graph's buffers planned into one arena (backend/memory_plan.h: liveness, best fit), one
// kernel per node from the op table (lower.h), and the run loop with its guards and profile. Running a program
// allocates nothing.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trl/backend/backend.h"
#include "backend/cpu/lower.h"
#include "backend/memory_plan.h"

namespace trl::cpu {

// The memory a program's planned buffers live in: owned by one program, or shared by all programs of a backend
// (CpuBackendOptions::share_arena) and grown to the largest. A program rebinds its buffers when `version` moved.
struct Arena {
  Tensor buffer;
  std::shared_ptr<const void> keepalive;  // held by output views, so a replaced buffer outlives the views into it
  size_t bytes = 0;
  uint64_t version = 0;
  uint64_t runs = 0;                // counts program runs (and stages) on this arena
  const void* last_runner = nullptr;  // the program that ran last: a two-stage program's stage 1 checks it
  // Makes the buffer at least `need` bytes (letting the old one go first, so that growing never holds both).
  void reserve(size_t need);
};

struct ProgramOptions {
  int num_threads = 1;     // OpenMP threads of the kernels and oneDNN, set for the duration of compile and run
  bool check_guards = false;  // TRL_CHECK_GUARDS=1: catch a kernel writing past its output, by name
  bool profile = false;       // TRL_PROFILE=1: seconds per op kind, printed when the program is destroyed
};

class CpuProgram final : public Program, public ProgramContext {
 public:
  // Plans (or adopts `cached_plan`, a plan_blob() of the same graph, when it fits: *used says whether it did) and
  // lowers `g`. `arena` null: the program owns its arena.
  CpuProgram(graph::Graph g, const ProgramOptions& options, std::shared_ptr<Arena> arena, const std::string* cached_plan = nullptr,
             bool* used = nullptr);
  ~CpuProgram() override;

  std::vector<Tensor> run(const TensorMap& inputs) override;
  std::vector<Tensor> run_stage(const TensorMap& inputs, int stage) override;
  size_t arena_bytes() const override { return arena_bytes_ + scratch_bytes_ + transient_bytes_; }
  std::string plan_blob() const override;
  double compile_seconds() const { return compile_seconds_; }

 private:
  void bind_arena();
  void lower_all();
  // Binds the arena and the given inputs (empty tensors are left as they are), then runs nodes [begin, end).
  void execute(const std::vector<Tensor>& bound, size_t begin, size_t end);
  // The outputs of nodes before `end` (the others as empty tensors).
  std::vector<Tensor> outputs(const std::vector<Tensor>& bound, size_t end = SIZE_MAX);
  void fill_guard(size_t i);
  void verify_guard(size_t i) const;

  ProgramOptions options_;
  MemoryPlan plan_;  // each node's buffer in the arena (backend/memory_plan.h)
  std::vector<Kernel> kernels_;
  uint64_t bound_version_ = 0;
  size_t stage_boundary_ = 0;        // graph::stage_boundary of the graph
  std::vector<Tensor> staged_;        // a two-stage run's inputs, held from stage 0 to stage 1
  uint64_t stage0_run_ = 0;           // arena_->runs right after this program's stage 0; 0: no stage 0 pending
  double compile_seconds_ = 0;
  std::array<double, 64> op_seconds_{};
};

// Sets the OpenMP thread count for a scope and restores the caller's on exit, so compiling or running a program
// leaves the process's setting as it was.
class ThreadScope {
 public:
  explicit ThreadScope(int threads);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

}  // namespace trl::cpu

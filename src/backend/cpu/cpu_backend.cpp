// The CPU backend: a graph traced for one shape is compiled once into a program whose buffers are planned into one
// arena (program.cpp), whose GEMMs are oneDNN matmul primitives created at compile time (gemm.cpp: bf16/f32 inputs,
// f32 accumulation), and whose other ops are f32 loops parallelised with OpenMP — the runtime oneDNN itself uses,
// so the two never oversubscribe the cores. Every op is lowered through the table below (lower.h lists the files).
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>

#include "backend/cpu/lower.h"
#include "backend/cpu/program.h"
#include "graph/passes.h"
#include "runtime/runtime.h"

namespace trl {

namespace cpu {

using graph::Op;

Kernel lower_alias(ProgramContext*, graph::ValueId) { return nullptr; }  // the run loop points it at its input

namespace {

// The op table: how each graph::Op is lowered on the CPU.
constexpr std::array<LowerFn, graph::kNumOps> kLowerings = [] {
  std::array<LowerFn, graph::kNumOps> t{};
  auto set = [&t](Op op, LowerFn f) { t[static_cast<size_t>(op)] = f; };
  set(Op::Input, lower_alias);
  set(Op::Reshape, lower_alias);
  set(Op::View, lower_alias);
  set(Op::Embedding, lower_embedding);
  set(Op::EmbeddingBackward, lower_embedding_backward);
  set(Op::Cast, lower_cast);
  set(Op::Fill, lower_fill);
  set(Op::Slice, lower_slice);
  set(Op::KvCacheWrite, lower_kv_cache_write);
  set(Op::Add, lower_add);
  set(Op::ScaleBy, lower_scale_by);
  set(Op::SwiGLU, lower_swiglu);
  set(Op::SwiGLUBackward, lower_swiglu_backward);
  set(Op::WeightedSum, lower_weighted_sum);
  set(Op::SumRows, lower_sum_rows);
  set(Op::MatMul, lower_matmul);
  set(Op::MatMulNN, lower_matmul_nn);
  set(Op::MatMulTN, lower_matmul_tn);
  set(Op::RmsNorm, lower_rms_norm);
  set(Op::RmsNormBackX, lower_rms_norm_backward);
  set(Op::RmsNormBackW, lower_rms_norm_backward);
  set(Op::Rope, lower_rope);
  set(Op::Attention, lower_attention);
  set(Op::AttentionBackward, lower_attention_backward);
  set(Op::TokenLogprobs, lower_vocab);
  set(Op::TokenLogprobsBackward, lower_vocab);
  set(Op::Entropy, lower_vocab);
  set(Op::EntropyBackward, lower_vocab);
  set(Op::TokenArgmaxMatch, lower_vocab);
  return t;
}();
static_assert(std::none_of(kLowerings.begin(), kLowerings.end(), [](LowerFn f) { return f == nullptr; }),
              "every graph::Op needs an entry in the CPU backend's op table");

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o) : shared_(o.share_arena ? std::make_shared<Arena>() : nullptr) {
    options_.num_threads = o.num_threads > 0 ? o.num_threads : num_threads();
  }
  std::string name() const override { return "cpu"; }
  // A full-depth Qwen3-0.6B training program compiles in about 0.1 s here, so the bucket is finer than Neuron's
  // 128: less padding for the same handful of programs, and one query block of the attention kernel.
  int64_t auto_pad_multiple() const override { return 64; }
  std::unique_ptr<Program> compile(const graph::Graph& graph) override { return make(graph, nullptr, nullptr); }
  std::unique_ptr<Program> compile_with_plan(const graph::Graph& graph, const std::string& plan, bool* used) override {
    return make(graph, &plan, used);
  }

 private:
  std::unique_ptr<Program> make(const graph::Graph& graph, const std::string* plan, bool* used) {
    ProgramOptions o = options_;
    o.check_guards = env_is("TRL_CHECK_GUARDS", "1");
    o.profile = env_is("TRL_PROFILE", "1");
    return std::make_unique<CpuProgram>(graph::eliminate_dead_code(graph), o, shared_, plan, used);
  }
  ProgramOptions options_;
  std::shared_ptr<Arena> shared_;  // null: each program owns its arena
};

}  // namespace

LowerFn lowering(graph::Op op) { return kLowerings[static_cast<size_t>(op)]; }

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<cpu::CpuBackend>(CpuBackendOptions{}); }
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) { return std::make_unique<cpu::CpuBackend>(options); }

}  // namespace trl

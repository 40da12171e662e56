// The CPU backend: a graph traced for one shape is compiled once into a program whose buffers are planned into one
// arena (program.cpp), whose GEMMs are oneDNN matmul primitives created at compile time (gemm.cpp: bf16/f32 inputs,
// f32 accumulation), and whose other ops are f32 loops parallelised with OpenMP — the runtime oneDNN itself uses,
// so the two never oversubscribe the cores. Every op is lowered through the table below (lower.h lists the files).
#include "trl/backend/cpu/cpu_backend.h"

#include <array>
#include <cstdlib>
#include <string>

#include "backend/cpu/adamw.h"
#include "backend/cpu/lower.h"
#include "backend/cpu/program.h"
#include "graph/passes.h"
#include "trl/core/error.h"
#include "trl/runtime/runtime.h"

namespace trl {

namespace cpu {

Kernel lower_alias(ProgramContext*, graph::ValueId) { return nullptr; }  // the run loop points it at its input

namespace {

// The op table: how each graph::Op is lowered on the CPU. A switch without a default, so that -Wswitch (an error
// in the Release and CI builds) names any op that has no entry.
constexpr LowerFn table_entry(Op op) {
  switch (op) {
    case Op::Input:
    case Op::Reshape:
    case Op::View: return lower_alias;
    case Op::Embedding: return lower_embedding;
    case Op::EmbeddingBackward: return lower_embedding_backward;
    case Op::Cast: return lower_cast;
    case Op::Fill: return lower_fill;
    case Op::Slice: return lower_slice;
    case Op::KvCacheWrite: return lower_kv_cache_write;
    case Op::Add: return lower_add;
    case Op::ScaleBy: return lower_scale_by;
    case Op::Dropout: return lower_dropout;
    case Op::SwiGLU: return lower_swiglu;
    case Op::SwiGLUBackward: return lower_swiglu_backward;
    case Op::WeightedSum: return lower_weighted_sum;
    case Op::SumRows: return lower_sum_rows;
    case Op::MatMul: return lower_matmul;
    case Op::MatMulNN: return lower_matmul_nn;
    case Op::MatMulTN: return lower_matmul_tn;
    case Op::RmsNorm: return lower_rms_norm;
    case Op::RmsNormBackX:
    case Op::RmsNormBackW: return lower_rms_norm_backward;
    case Op::Rope: return lower_rope;
    case Op::Attention: return lower_attention;
    case Op::AttentionBackward: return lower_attention_backward;
    case Op::VocabStats: return lower_vocab_stats;
    case Op::TokenLogprobs:
    case Op::Entropy:
    case Op::TokenArgmaxMatch: return lower_vocab_forward;
    case Op::TokenLogprobsBackward:
    case Op::EntropyBackward: return lower_vocab_backward;
    case Op::Jsd: return lower_jsd;
    case Op::JsdBackward: return lower_jsd_backward;
    case Op::AllReduce:
    case Op::AllReduceGrad: return lower_collective;
    case Op::MoeTopK:
    case Op::MoeRouteWeights:
    case Op::MoeRouteWeightsBackward:
    case Op::MoeRouterStats:
    case Op::MoeRouterStatsBackward:
    case Op::MoeAuxLoss:
    case Op::MoeAuxLossBackward: return lower_moe_router;
    case Op::MoeExperts: return lower_moe_experts;
    case Op::MoeExpertsBackward: return lower_moe_experts_backward;
    case Op::BatchedMatMul: return lower_batched_matmul;
  }
  return nullptr;
}

// Indexed by Op.
constexpr std::array<LowerFn, graph::kNumOps> kLowerings = [] {
  std::array<LowerFn, graph::kNumOps> t{};
  for (size_t i = 0; i < t.size(); ++i) t[i] = table_entry(static_cast<Op>(i));
  return t;
}();

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o) : shared_(o.share_arena ? std::make_shared<Arena>() : nullptr), graph_passes_(o.graph_passes) {
    options_.num_threads = o.num_threads > 0 ? o.num_threads : num_threads();
  }
  std::string name() const override { return "cpu"; }
  // A full-depth Qwen3-0.6B training program compiles in about 0.1 s here, so the bucket is finer than Neuron's
  // 128: less padding for the same handful of programs, and one query block of the attention kernel.
  int64_t auto_pad_multiple() const override { return 64; }
  void adamw_step(const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& weight, Tensor* compute, const AdamWStep& step) override {
    cpu::adamw_step(grad, exp_avg, exp_avg_sq, weight, compute, step);
  }
  std::string adamw_kernel() const override { return cpu::adamw_kernel(); }
  std::unique_ptr<Program> compile(const graph::Graph& graph) override { return make(graph, nullptr, nullptr); }
  std::unique_ptr<Program> compile_with_plan(const graph::Graph& graph, const std::string& plan, bool* used) override {
    return make(graph, &plan, used);
  }

 private:
  std::unique_ptr<Program> make(const graph::Graph& graph, const std::string* plan, bool* used) {
    ProgramOptions o = options_;
    o.check_guards = env_is("TRL_CHECK_GUARDS", "1");
    o.profile = env_is("TRL_PROFILE", "1");
    return std::make_unique<CpuProgram>(graph_passes_ ? graph::optimize(graph) : graph::eliminate_dead_code(graph), o, shared_, plan, used);
  }
  ProgramOptions options_;
  std::shared_ptr<Arena> shared_;  // null: each program owns its arena
  bool graph_passes_;
};

}  // namespace

LowerFn lowering(graph::Op op) {
  const size_t i = static_cast<size_t>(op);
  if (i >= kLowerings.size() || kLowerings[i] == nullptr) fail("cpu backend: op {} has no lowering", graph::op_name(op));
  return kLowerings[i];
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<cpu::CpuBackend>(CpuBackendOptions{}); }
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) { return std::make_unique<cpu::CpuBackend>(options); }

}  // namespace trl

#include "backend/cpu/gemm.h"

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cpu_features.h"
#include "trl/core/error.h"

namespace trl::cpu {

namespace {

dnnl::memory::data_type dnnl_type(DType dt) {
  switch (dt) {
    case DType::F32: return dnnl::memory::data_type::f32;
    case DType::BF16: return dnnl::memory::data_type::bf16;
    case DType::F16: return dnnl::memory::data_type::f16;
    default: fail("cpu backend: no oneDNN type for {}", dtype_name(dt));
  }
}

}  // namespace

const dnnl::engine& dnnl_engine() {
  static const dnnl::engine e{dnnl::engine::kind::cpu, 0};
  return e;
}

Gemm::Gemm(int64_t M, int64_t N, int64_t K, DType ta, int64_t sa_m, int64_t sa_k, DType tb, int64_t sb_k, int64_t sb_n, DType tc, bool bias,
           bool accumulate, int64_t ldc)
    : M_(M), N_(N), K_(K), ldc_(ldc == 0 ? N : ldc) {
  if (!create(ta, sa_m, sa_k, tb, sb_k, sb_n, tc, ldc_, bias, accumulate)) {
    for (DType t : {ta, tb, tc})
      if (t != DType::F32 && t != DType::BF16)
        fail("cpu backend: no GEMM for {} x {} -> {} ([{}, {}] x [{}, {}]) on this CPU ({}): oneDNN has no such matmul here and the "
             "backend's own GEMM takes f32 and bf16 only",
             dtype_name(ta), dtype_name(tb), dtype_name(tc), M, K, K, N, best_isa());
    packed_ = true;
    packed_gemm_ = PackedGemm{M, N, K, ta, sa_m, sa_k, tb, sb_k, sb_n, tc, ldc_};
  }
  has_bias_ = bias;
  accumulate_ = accumulate;
}

void Gemm::run(const void* a, const void* b, void* c, const void* bias) const {
  if (packed_) return packed_gemm_.run(a, b, c, static_cast<const float*>(bias), accumulate_);
  const dnnl::engine& engine = dnnl_engine();
  thread_local dnnl::stream stream(engine);
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, dnnl::memory(a_, engine, const_cast<void*>(a))},
                                                {DNNL_ARG_WEIGHTS, dnnl::memory(b_, engine, const_cast<void*>(b))},
                                                {DNNL_ARG_DST, dnnl::memory(c_, engine, c)}};
  if (has_bias_) args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_, engine, const_cast<void*>(bias)));
  thread_local std::vector<char> scratch;
  if (scratch.size() < scratch_md_.get_size()) scratch.resize(scratch_md_.get_size());
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratch_md_, engine, scratch.data()));
  prim_.execute(stream, args);
  stream.wait();
}

const char* Gemm::kernel() const { return packed_ ? packed_kernel_name(packed_gemm_.kernel) : "onednn"; }

// Creates (or finds) the primitive; false when oneDNN has none for these types on this CPU.
bool Gemm::create(DType ta, int64_t sa_m, int64_t sa_k, DType tb, int64_t sb_k, int64_t sb_n, DType tc, int64_t ldc, bool bias, bool accumulate) {
  using md = dnnl::memory::desc;
  a_ = md({M_, K_}, dnnl_type(ta), {sa_m, sa_k});
  b_ = md({K_, N_}, dnnl_type(tb), {sb_k, sb_n});
  c_ = md({M_, N_}, dnnl_type(tc), {ldc, 1});
  if (bias) bias_ = md({1, N_}, dnnl::memory::data_type::f32, {N_, 1});
  dnnl::primitive_attr attr;
  // User-managed scratchpad: the same primitive may run on several threads at once (attention tasks), which
  // oneDNN allows only when each execution brings its own scratchpad.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  // Layers of the same shape share one primitive: a 28-layer model needs ~20 distinct GEMMs, not 600.
  static std::mutex mu;
  static std::map<std::vector<int64_t>, std::pair<dnnl::matmul, dnnl::memory::desc>> cache;
  const std::vector<int64_t> key = {M_, N_, K_, static_cast<int64_t>(ta), sa_m, sa_k, static_cast<int64_t>(tb), sb_k, sb_n,
                                    static_cast<int64_t>(tc), bias, accumulate, ldc};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    try {
      const auto d = bias ? dnnl::matmul::desc(a_, b_, bias_, c_) : dnnl::matmul::desc(a_, b_, c_);
      const dnnl::matmul::primitive_desc pd(d, attr, dnnl_engine());
      it = cache.emplace(key, std::make_pair(dnnl::matmul(pd), pd.scratchpad_desc())).first;
    } catch (const dnnl::error&) {
      return false;
    }
  }
  prim_ = it->second.first;
  scratch_md_ = it->second.second;
  return true;
}

}  // namespace trl::cpu

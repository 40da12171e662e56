#include "backend/cpu/gemm.h"

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cpu/elementwise.h"
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

// x: rows×cols in `dt` with strides (s_r, s_c) → contiguous f32 in buf.
const float* widen(const void* x, DType dt, int64_t rows, int64_t cols, int64_t s_r, int64_t s_c, std::vector<float>& buf) {
  buf.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) buf[static_cast<size_t>(r * cols + c)] = ld(x, dt, r * s_r + c * s_c);
  return buf.data();
}

}  // namespace

const dnnl::engine& dnnl_engine() {
  static const dnnl::engine e{dnnl::engine::kind::cpu, 0};
  return e;
}

Gemm::Gemm(int64_t M, int64_t N, int64_t K, DType ta, int64_t sa_m, int64_t sa_k, DType tb, int64_t sb_k, int64_t sb_n, DType tc, bool bias,
           bool accumulate, int64_t ldc)
    : M_(M), N_(N), K_(K), sa_m_(sa_m), sa_k_(sa_k), sb_k_(sb_k), sb_n_(sb_n), ldc_(ldc == 0 ? N : ldc), ta_(ta), tb_(tb), tc_(tc) {
  if (!create(ta, sa_m, sa_k, tb, sb_k, sb_n, tc, ldc_, bias, accumulate)) {
    widen_a_ = ta != DType::F32, widen_b_ = tb != DType::F32, widen_c_ = tc != DType::F32;
    if (!create(DType::F32, widen_a_ ? K : sa_m, widen_a_ ? 1 : sa_k, DType::F32, widen_b_ ? N : sb_k, widen_b_ ? 1 : sb_n, DType::F32,
                widen_c_ ? N : ldc_, bias, accumulate))
      fail("cpu backend: oneDNN has no f32 matmul for [{}, {}] x [{}, {}] on this CPU", M, K, K, N);
  }
  has_bias_ = bias;
  accumulate_ = accumulate;
}

void Gemm::run(const void* a, const void* b, void* c, const void* bias) const {
  const dnnl::engine& engine = dnnl_engine();
  thread_local dnnl::stream stream(engine);
  thread_local std::vector<float> wa, wb, wc;
  if (widen_a_) a = widen(a, ta_, M_, K_, sa_m_, sa_k_, wa);
  if (widen_b_) b = widen(b, tb_, K_, N_, sb_k_, sb_n_, wb);
  void* cc = c;
  if (widen_c_) {
    wc.resize(static_cast<size_t>(M_ * N_));
    cc = wc.data();
    if (accumulate_)  // C += A·B on the widened result: start from C itself
      for (int64_t m = 0; m < M_; ++m)
        for (int64_t n = 0; n < N_; ++n) wc[static_cast<size_t>(m * N_ + n)] = ld(c, tc_, m * ldc_ + n);
  }
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, dnnl::memory(a_, engine, const_cast<void*>(a))},
                                                {DNNL_ARG_WEIGHTS, dnnl::memory(b_, engine, const_cast<void*>(b))},
                                                {DNNL_ARG_DST, dnnl::memory(c_, engine, cc)}};
  if (has_bias_) args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_, engine, const_cast<void*>(bias)));
  thread_local std::vector<char> scratch;
  if (scratch.size() < scratch_md_.get_size()) scratch.resize(scratch_md_.get_size());
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratch_md_, engine, scratch.data()));
  prim_.execute(stream, args);
  stream.wait();
  if (widen_c_)
    for (int64_t m = 0; m < M_; ++m)
      for (int64_t n = 0; n < N_; ++n) st(c, tc_, m * ldc_ + n, wc[static_cast<size_t>(m * N_ + n)]);
}


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

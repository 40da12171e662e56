// AdamW as torch.optim.AdamW computes it (decoupled weight decay), on f32 master weights with f32 moments, in one
// fused, OpenMP-parallel pass per tensor.
#pragma once

#include <map>
#include <string>

#include "trl/core/tensor.h"

namespace trl {

using TensorMap = std::map<std::string, Tensor>;

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Transformers' rule: no weight decay for biases and normalisation weights (names matching bias, layernorm,
// rmsnorm, (^|.)norm($|.), _norm($|.)); everything else (embeddings and projections) is decayed.
bool applies_weight_decay(const std::string& parameter_name);

// The family of AdamW's pass on this CPU: "avx512", "avx2" or "portable" (the same bits on each).
const char* adamw_kernel();

class AdamW {
 public:
  explicit AdamW(AdamWConfig config = {}) : config_(config) {}
  // Updates `params` (owned f32 tensors) in place from `grads` (f32, same names and shapes), with learning rate lr.
  void step(TensorMap& params, const TensorMap& grads, double lr);
  // The same, also writing each updated weight into `compute` (the bf16 compute copies of mixed precision) in the
  // same pass over memory.
  void step(TensorMap& params, const TensorMap& grads, double lr, TensorMap* compute);
  int64_t steps() const { return steps_; }
  // Restores the moments and the step count (resuming from a checkpoint).
  void set_state(TensorMap exp_avg, TensorMap exp_avg_sq, int64_t steps) {
    m_ = std::move(exp_avg);
    v_ = std::move(exp_avg_sq);
    steps_ = steps;
  }
  const TensorMap& exp_avg() const { return m_; }
  const TensorMap& exp_avg_sq() const { return v_; }

 private:
  AdamWConfig config_;
  TensorMap m_, v_;
  int64_t steps_ = 0;
};

}  // namespace trl

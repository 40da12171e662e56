// AdamW as torch.optim.AdamW computes it (decoupled weight decay), on f32 master weights with f32 moments: the
// optimizer's state and step constants here, the pass over each tensor on the backend where the tensors live
// (Backend::adamw_step; the CPU's vectorised kernels are in backend/cpu/adamw.cpp).
#pragma once

#include <map>
#include <string>

#include "trl/backend/backend.h"
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

class AdamW {
 public:
  explicit AdamW(AdamWConfig config = {}) : config_(config) {}
  // Updates `params` (f32 masters in `backend`'s memory) in place from `grads` (f32, same names and shapes) with
  // learning rate lr, on `backend`; `compute` (optional): the bf16 compute copies of mixed precision, written in
  // the same pass. The moments are made on `backend` at the first step.
  void step(TensorMap& params, const TensorMap& grads, double lr, Backend& backend, TensorMap* compute = nullptr);
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

#include "train/optim/adamw.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "trl/core/dtype.h"
#include "trl/core/error.h"

namespace trl {

bool applies_weight_decay(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (n.find("bias") != std::string::npos || n.find("layernorm") != std::string::npos || n.find("rmsnorm") != std::string::npos) return false;
  // (^|\.)norm($|\.) and _norm($|\.)
  for (size_t p = n.find("norm"); p != std::string::npos; p = n.find("norm", p + 1)) {
    const bool end_ok = p + 4 == n.size() || n[p + 4] == '.';
    const bool start_ok = p == 0 || n[p - 1] == '.' || n[p - 1] == '_';
    if (start_ok && end_ok) return false;
  }
  return true;
}

void AdamW::step(TensorMap& params, const TensorMap& grads, double lr, Backend& backend, TensorMap* compute) {
  ++steps_;
  const double bc1 = 1.0 - std::pow(config_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(config_.beta2, static_cast<double>(steps_));
  for (auto& [name, p] : params) {
    auto g_it = grads.find(name);
    if (g_it == grads.end()) fail("AdamW: no gradient for '{}'", name);
    const Tensor& g = g_it->second;
    if (p.dtype() != DType::F32 || g.dtype() != DType::F32 || p.shape() != g.shape()) {
      fail("AdamW: '{}' needs f32 weights and gradients of the same shape (got {} {} and {} {})", name, dtype_name(p.dtype()),
           shape_str(p.shape()), dtype_name(g.dtype()), shape_str(g.shape()));
    }
    Tensor* w16 = nullptr;
    if (compute != nullptr) {
      auto c = compute->find(name);
      if (c == compute->end() || c->second.dtype() != DType::BF16 || c->second.shape() != p.shape()) {
        fail("AdamW: no bf16 compute copy of '{}' with shape {}", name, shape_str(p.shape()));
      }
      w16 = &c->second;
    }
    // torch.optim.AdamW's arithmetic, in f32: decay, moments, then p -= lr/bc1 · m / (sqrt(v)/sqrt(bc2) + eps).
    Backend::AdamWStep u;
    u.keep = static_cast<float>(1.0 - lr * (applies_weight_decay(name) ? config_.weight_decay : 0.0));
    u.b1 = static_cast<float>(config_.beta1), u.b2 = static_cast<float>(config_.beta2), u.eps = static_cast<float>(config_.eps);
    u.step_size = static_cast<float>(lr / bc1), u.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    // New moments start at zero: they are allocated uninitialised and written by the step's first pass (its first
    // touch of gigabytes of fresh pages is then split over the threads, and nothing is written twice). Made after
    // every check that can fail, so that a failed step leaves no half-made moments.
    u.fresh = !m_.count(name);
    if (u.fresh) {
      check_adamw_step(g, p, p, p, w16);  // the backend's checks (contiguity) before the moments exist
      m_[name] = backend.allocate(DType::F32, p.shape(), "exp_avg of " + name);
      v_[name] = backend.allocate(DType::F32, p.shape(), "exp_avg_sq of " + name);
    }
    backend.adamw_step(g, m_[name], v_[name], p, w16, u);
  }
}

}  // namespace trl

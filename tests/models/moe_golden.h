// The Qwen3-MoE goldens' batch (tests/reference/qwen3_moe_reference.py's ROWS), as the model tests bind it: shared
// by tests/models/moe_test.cpp (Transformers) and tests/models/moe_lora_test.cpp (PEFT).
#pragma once

#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/core/tensor.h"
#include "trl/models/causal_lm.h"

namespace trl {

// The golden batch, right-padded: ids, mask, labels (the next token; 0 where there is none) and the loss weights
// (-1 / number of predicted tokens: Transformers' mean cross-entropy).
struct PaddedBatch {
  int64_t B = 0, T = 0;
  Tensor ids, mask, positions, labels, weights;
};
inline PaddedBatch golden_batch(const nlohmann::json& rows) {
  PaddedBatch p;
  p.B = static_cast<int64_t>(rows.size());
  for (const auto& r : rows) p.T = std::max<int64_t>(p.T, static_cast<int64_t>(r.size()));
  std::vector<int32_t> ids(static_cast<size_t>(p.B * p.T), 0), mask(ids.size(), 0), labels(ids.size(), 0);
  std::vector<float> w(ids.size(), 0.0f);
  int64_t n = 0;
  for (const auto& r : rows) n += static_cast<int64_t>(r.size()) - 1;
  for (int64_t b = 0; b < p.B; ++b) {
    const auto r = rows[static_cast<size_t>(b)].get<std::vector<int32_t>>();
    for (size_t t = 0; t < r.size(); ++t) {
      const size_t i = static_cast<size_t>(b * p.T) + t;
      ids[i] = r[t];
      mask[i] = 1;
      if (t + 1 < r.size()) {
        labels[i] = r[t + 1];
        w[i] = -1.0f / static_cast<float>(n);
      }
    }
  }
  p.ids = Tensor::from_i32(ids, {p.B, p.T});
  p.mask = Tensor::from_i32(mask, {p.B, p.T});
  p.positions = default_position_ids(p.mask);
  p.labels = Tensor::from_i32(labels, {p.B, p.T});
  p.weights = Tensor::from_f32(w, {p.B, p.T});
  return p;
}

}  // namespace trl

// trl.cpp's public C++ API: the names a Transformers/TRL user already knows.
//
//   #include <trl/trl.h>
//   auto model = trl::AutoModelForCausalLM::from_pretrained("Qwen/Qwen3-0.6B", {.dtype = trl::BF16});
//   trl::Batch batch{.input_ids = trl::Tensor::from_i32(ids, {1, n})};
//   auto backend = trl::make_reference_backend();
//   trl::Tensor logits = model.forward(batch, *backend);   // [1, n, vocab] f32
//
// Model ids resolve only in the local Hugging Face cache; nothing is downloaded.
#pragma once

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "io/hub.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/init.h"
#include "models/score.h"
#include "runtime/runtime.h"

namespace trl {

inline constexpr DType F32 = DType::F32;
inline constexpr DType BF16 = DType::BF16;
inline constexpr DType F16 = DType::F16;

// Transformers' entry point for causal LMs (Qwen3, Qwen2, Llama).
struct AutoModelForCausalLM {
  static CausalLM from_pretrained(const std::string& name_or_path, const LoadOptions& options = {}) {
    return CausalLM::from_pretrained(name_or_path, options);
  }
};

struct AutoConfig {
  static ModelConfig from_pretrained(const std::string& name_or_path, const std::string& revision = "main") {
    return ModelConfig::load(resolve_model_dir(name_or_path, revision) + "/config.json");
  }
};

}  // namespace trl

// trl.cpp's public C++ API: the names a Transformers/TRL user already knows.
//
//   #include <trl/trl.h>
//   auto tok = trl::AutoTokenizer::from_pretrained("Qwen/Qwen3-0.6B");
//   auto model = trl::AutoModelForCausalLM::from_pretrained("Qwen/Qwen3-0.6B", {.dtype = trl::BF16});
//   auto enc = tok({"The French Bread Law states"});
//   trl::Batch batch{.input_ids = enc.input_ids_tensor(), .attention_mask = enc.attention_mask_tensor()};
//   auto backend = trl::make_backend("auto");              // or "cpu", "reference" (backend/registry.h)
//   trl::Tensor logits = model.forward(batch, *backend);   // [1, n, vocab] f32
//   trl::GenerationConfig cfg;
//   cfg.max_new_tokens = 50;
//   auto out = trl::generate(model, {tok.encode("The French Bread Law states")}, cfg);   // static KV cache
//
// Model ids resolve only in the local Hugging Face cache; nothing is downloaded.
#pragma once

#include "trl/backend/backend.h"
#include "trl/backend/cpu/cpu_backend.h"
#include "trl/backend/registry.h"
#include "trl/core/dtype.h"
#include "trl/core/error.h"
#include "trl/core/tensor.h"
#include "trl/generation/generate.h"
#include "trl/io/hub.h"
#include "trl/io/model_config.h"
#include "trl/io/safetensors.h"
#include "trl/models/causal_lm.h"
#include "trl/models/init.h"
#include "trl/models/score.h"
#include "trl/runtime/runtime.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/tokenizer/tokenizer.h"

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

// Transformers' model.generate(): prompts of token ids in, sequences out (see include/trl/generation/generate.h). For
// repeated calls keep a trl::Generator, which keeps the compiled programs and the KV cache between calls.
inline GenerationOutput generate(const CausalLM& model, const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& config = {},
                                 const Tokenizer* tokenizer = nullptr) {
  Generator gen(model);
  return gen.generate(prompts, config, tokenizer);
}

struct AutoTokenizer {
  static Tokenizer from_pretrained(const std::string& name_or_path, const std::string& revision = "main") {
    return Tokenizer::from_pretrained(name_or_path, revision);
  }
};

struct AutoConfig {
  static ModelConfig from_pretrained(const std::string& name_or_path, const std::string& revision = "main") {
    return ModelConfig::load(resolve_model_dir(name_or_path, revision) + "/config.json");
  }
};

}  // namespace trl

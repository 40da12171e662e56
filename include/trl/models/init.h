// Randomly initialised models in the Hugging Face layout (`trl init-model`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trl/io/model_config.h"
#include "trl/models/causal_lm.h"

namespace trl {

// tiny: hidden 64, ffn 128, 2 layers, 4 heads, 2 kv heads, head_dim 16. small: hidden 256, ffn 768, 4 layers,
// 4 heads, 2 kv heads, head_dim 64. qwen3-0.6b, qwen3-1.7b: the real models' shapes. Mixtures of experts
// (qwen3_moe): tiny-moe (tiny's attention, 8 experts of width 32, 2 per token, renormalised) and qwen3-30b-a3b (the
// real Qwen3-30B-A3B's shapes: 48 layers, 128 experts of width 768, 8 per token, untied). All use the real vocabulary
// (151936) and Qwen3-0.6B's other settings (rope_theta 1e6, eps 1e-6, special token ids; tied embeddings but for
// qwen3-30b-a3b).
std::vector<std::string> model_presets();
ModelConfig preset_config(const std::string& preset, DType dtype);

struct InitOptions {
  std::string preset = "tiny";
  DType dtype = DType::F32;
  uint64_t seed = 0;
  double initializer_range = 0;   // <= 0: the config's (0.02)
  bool randomize_norms = false;   // norm weights 1 + N(0, std) instead of 1 (exercises the norm scales in tests)
  uint64_t max_shard_bytes = 5'000'000'000ull;
  int64_t num_hidden_layers = 0;  // > 0: this many layers of the preset's widths (benchmarks at reduced depth)
  // > 0: a cut vocabulary of this many tokens (fast tests and experiments, where the vocabulary is not what is
  // studied): the Qwen3 tokenizer's first vocab_size - 26 tokens with the merges that make them (a merge's rank is
  // its token's id - 256, so every text still tokenizes, into shorter tokens), then its 26 special tokens. The model's
  // embedding has exactly these rows; bos, eos and pad ids follow the special tokens. 0: the preset's 151936.
  int64_t vocab_size = 0;
};

// Transformers' initialisation: every Linear and the embedding ~ N(0, initializer_range), norms = 1. Each
// tensor has its own stream seeded from (seed, name), so its values do not depend on the other tensors, and the
// same seed gives the same bytes on every machine (see core/rng.h).
TensorMap init_weights(const ModelConfig& config, DType dtype, uint64_t seed, double std, bool randomize_norms);

// Writes a complete model folder: config.json, generation_config.json, model.safetensors (or shards), and the
// Qwen3 tokenizer files (tokenizer.json, tokenizer_config.json) that ship inside trl.
CausalLM init_model(const InitOptions& options, const std::string& out_dir);

// Writes the bundled Qwen3 tokenizer files into `dir`; with vocab_size > 0, cut to that many tokens as
// InitOptions::vocab_size says.
void write_tokenizer_files(const std::string& dir, int64_t vocab_size = 0);

// The smallest and largest InitOptions::vocab_size: the 256 byte tokens and the special tokens must fit, and the cut
// cannot be larger than the tokenizer.
int64_t min_cut_vocab_size();
int64_t max_cut_vocab_size();

}  // namespace trl

// config.json of a Hugging Face causal LM, for the decoder family trl.cpp runs: qwen3 (q/k RMSNorm, no bias),
// qwen2 (q/k/v bias, no q/k norm), llama (no q/k norm, optional "llama3" RoPE scaling) and qwen3_moe (qwen3's
// attention, a mixture of experts in place of the MLP: MoeConfig).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trl {

struct RopeScaling {
  std::string rope_type = "default";  // "default" (none) or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// The mixture of experts of a qwen3_moe model (Transformers' Qwen3MoeConfig field names and defaults).
struct MoeConfig {
  int64_t num_experts = 0;  // 0: a dense model (every layer a SwiGLU MLP of intermediate_size)
  int64_t num_experts_per_tok = 8;
  int64_t moe_intermediate_size = 768;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;  // dense layers among the sparse ones
  bool norm_topk_prob = false;           // divide the chosen experts' probabilities by their sum
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;     // Transformers' default; the trainers turn the load-balancing loss on (TRL's SFT does)
};

struct ModelConfig {
  std::string model_type = "qwen3";
  std::vector<std::string> architectures;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 32768;
  int64_t max_window_layers = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  double attention_dropout = 0.0;
  std::string hidden_act = "silu";
  std::string torch_dtype = "float32";
  bool tie_word_embeddings = false;
  bool use_cache = true;
  bool use_sliding_window = false;
  std::optional<int64_t> sliding_window;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> pad_token_id;

  MoeConfig moe;  // num_experts > 0 for qwen3_moe

  // Derived from model_type (and attention_bias): what the decoder has.
  bool qk_norm = true;     // qwen3
  bool qkv_bias = false;   // qwen2, or attention_bias
  bool o_bias = false;     // llama with attention_bias
  bool mlp_bias = false;   // llama's mlp_bias

  // Parses and validates; `source` names the file in errors ("model/config.json: field 'hidden_size' ...").
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig load(const std::string& path);
  // The config.json Transformers writes for this model (keys sorted, every field present).
  nlohmann::json to_json() const;

  // Whether decoder layer i is a mixture of experts: a qwen3_moe layer not in mlp_only_layers with
  // (i + 1) % decoder_sparse_step == 0 (Transformers' rule).
  bool sparse_layer(int64_t i) const;
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

std::vector<std::string> supported_model_types();

}  // namespace trl

#include "trl/io/model_config.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include <fmt/ranges.h>

#include "core/fs.h"
#include "core/json_text.h"
#include "trl/core/error.h"

namespace trl {

using json = nlohmann::json;

std::vector<std::string> supported_model_types() { return {"qwen3", "qwen2", "llama", "qwen3_moe"}; }

namespace {

class Fields {
 public:
  Fields(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  [[noreturn]] void bad(const std::string& key, const std::string& expected) const {
    fail("{}: field '{}' must be {}, got {} ({})", source_, key, expected, json_kind(j_[key]), j_[key].dump());
  }
  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t integer(const std::string& key, std::optional<int64_t> def = std::nullopt) const {
    if (!has(key)) {
      if (!def) fail("{}: missing required field '{}'", source_, key);
      return *def;
    }
    const json& v = j_[key];
    if (!v.is_number_integer() && !v.is_number_unsigned()) bad(key, "an integer");
    return v.get<int64_t>();
  }
  int64_t positive(const std::string& key, std::optional<int64_t> def = std::nullopt) const {
    int64_t v = integer(key, def);
    if (v <= 0) fail("{}: field '{}' must be positive, got {}", source_, key, v);
    return v;
  }
  double number(const std::string& key, double def) const {
    if (!has(key)) return def;
    const json& v = j_[key];
    if (!v.is_number()) bad(key, "a number");
    return v.get<double>();
  }
  bool boolean(const std::string& key, bool def) const {
    if (!has(key)) return def;
    if (!j_[key].is_boolean()) bad(key, "true or false");
    return j_[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& def) const {
    if (!has(key)) return def;
    if (!j_[key].is_string()) bad(key, "a string");
    return j_[key].get<std::string>();
  }
  std::optional<int64_t> optional_integer(const std::string& key) const {
    if (!has(key)) return std::nullopt;
    return integer(key);
  }
  const std::string& source() const { return source_; }

 private:
  const json& j_;
  std::string source_;
};

RopeScaling parse_rope_scaling(const json& r, const std::string& source, const std::string& key) {
  RopeScaling rs;
  if (r.is_null()) {
    rs.rope_type = "default";
    return rs;
  }
  if (!r.is_object()) fail("{}: field '{}' must be an object or null, got {}", source, key, r.dump());
  Fields f(r, source + ": " + key);
  rs.rope_type = f.has("rope_type") ? f.string("rope_type", "default") : f.string("type", "default");
  if (rs.rope_type == "default") return rs;
  if (rs.rope_type != "llama3") {
    fail("{}: {} rope_type '{}' is not supported (supported: default, llama3)", source, key, rs.rope_type);
  }
  rs.factor = f.number("factor", 8.0);
  rs.low_freq_factor = f.number("low_freq_factor", 1.0);
  rs.high_freq_factor = f.number("high_freq_factor", 4.0);
  rs.original_max_position_embeddings = f.positive("original_max_position_embeddings", 8192);
  if (rs.factor <= 0 || rs.low_freq_factor <= 0 || rs.high_freq_factor <= rs.low_freq_factor) {
    fail("{}: {}: need factor > 0 and high_freq_factor > low_freq_factor > 0", source, key);
  }
  return rs;
}

// qwen3_moe's fields. Transformers v5 writes num_experts as num_local_experts (its attribute_map); both are read.
void parse_moe(const json& j, const Fields& f, ModelConfig& c) {
  MoeConfig& m = c.moe;
  const char* experts_key = f.has("num_experts") ? "num_experts" : "num_local_experts";
  m.num_experts = f.positive(experts_key, 128);
  m.num_experts_per_tok = f.positive("num_experts_per_tok", 8);
  m.moe_intermediate_size = f.positive("moe_intermediate_size", 768);
  m.decoder_sparse_step = f.positive("decoder_sparse_step", 1);
  m.norm_topk_prob = f.boolean("norm_topk_prob", false);
  m.router_aux_loss_coef = f.number("router_aux_loss_coef", 0.001);
  m.output_router_logits = f.boolean("output_router_logits", false);
  if (f.has("mlp_only_layers")) {
    const json& v = j["mlp_only_layers"];
    if (!v.is_array()) f.bad("mlp_only_layers", "a list of layer indices");
    for (const json& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.num_hidden_layers)
        fail("{}: field 'mlp_only_layers' must list layer indices in [0, {}), got {}", f.source(), c.num_hidden_layers, v.dump());
      m.mlp_only_layers.push_back(x.get<int64_t>());
    }
  }
  if (m.num_experts > 4096) fail("{}: field '{}' is {}, beyond any model this program can hold (4096 at most)", f.source(), experts_key, m.num_experts);
  if (m.moe_intermediate_size > (int64_t{1} << 20))
    fail("{}: field 'moe_intermediate_size' is {}, beyond any model this program can hold ({} at most)", f.source(), m.moe_intermediate_size, int64_t{1} << 20);
  if (m.num_experts_per_tok > m.num_experts)
    fail("{}: num_experts_per_tok ({}) must be at most {} ({})", f.source(), m.num_experts_per_tok, experts_key, m.num_experts);
  if (!std::isfinite(m.router_aux_loss_coef) || m.router_aux_loss_coef < 0)
    fail("{}: field 'router_aux_loss_coef' must be a finite number >= 0, got {}", f.source(), m.router_aux_loss_coef);
}

}  // namespace

bool ModelConfig::sparse_layer(int64_t i) const {
  if (moe.num_experts == 0) return false;
  if (std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), i) != moe.mlp_only_layers.end()) return false;
  return (i + 1) % moe.decoder_sparse_step == 0;
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: expected a JSON object", source);
  Fields f(j, source);
  ModelConfig c;
  c.model_type = f.string("model_type", "");
  const auto types = supported_model_types();
  if (std::find(types.begin(), types.end(), c.model_type) == types.end()) {
    fail("{}: model_type '{}' is not supported (supported: {})", source, c.model_type, fmt::join(types, ", "));
  }
  if (f.has("architectures")) {
    if (!j["architectures"].is_array()) f.bad("architectures", "an array of strings");
    for (const json& a : j["architectures"]) {
      if (!a.is_string()) f.bad("architectures", "an array of strings");
      c.architectures.push_back(a.get<std::string>());
    }
  }
  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.intermediate_size = f.positive("intermediate_size");
  c.num_hidden_layers = f.positive("num_hidden_layers");
  c.num_attention_heads = f.positive("num_attention_heads");
  c.num_key_value_heads = f.positive("num_key_value_heads", c.num_attention_heads);
  // Qwen3Config's head_dim defaults to 128; Qwen3MoeConfig (Transformers v5) has none: hidden_size / heads.
  const int64_t default_head_dim = c.model_type == "qwen3" ? 128 : c.hidden_size / c.num_attention_heads;
  c.head_dim = c.model_type == "qwen2" ? c.hidden_size / c.num_attention_heads : f.positive("head_dim", default_head_dim);
  c.max_position_embeddings = f.positive("max_position_embeddings", 32768);
  c.max_window_layers = f.integer("max_window_layers", c.num_hidden_layers);
  c.rms_norm_eps = f.number("rms_norm_eps", c.model_type == "llama" ? 1e-6 : 1e-6);
  c.initializer_range = f.number("initializer_range", 0.02);
  c.attention_dropout = f.number("attention_dropout", 0.0);
  c.hidden_act = f.string("hidden_act", "silu");
  c.torch_dtype = f.has("torch_dtype") ? f.string("torch_dtype", "float32") : f.string("dtype", "float32");
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", c.model_type == "llama");
  c.use_cache = f.boolean("use_cache", true);
  c.use_sliding_window = f.boolean("use_sliding_window", false);
  c.sliding_window = f.optional_integer("sliding_window");
  c.bos_token_id = f.optional_integer("bos_token_id");
  c.pad_token_id = f.optional_integer("pad_token_id");
  if (f.has("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_array()) {
      for (const json& v : e) {
        if (!v.is_number_integer()) f.bad("eos_token_id", "an integer or an array of integers");
        c.eos_token_ids.push_back(v.get<int64_t>());
      }
    } else {
      c.eos_token_ids.push_back(f.integer("eos_token_id"));
    }
  }
  // RoPE: classic fields (rope_theta, rope_scaling) or Transformers v5's rope_parameters.
  c.rope_theta = f.number("rope_theta", 10000.0);
  c.rope_scaling = parse_rope_scaling(j.contains("rope_scaling") ? j["rope_scaling"] : json(nullptr), source, "rope_scaling");
  if (f.has("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    c.rope_scaling = parse_rope_scaling(rp, source, "rope_parameters");
    if (rp.is_object() && rp.contains("rope_theta")) c.rope_theta = Fields(rp, source + ": rope_parameters").number("rope_theta", c.rope_theta);
  }
  if (c.rope_theta <= 0) fail("{}: field 'rope_theta' must be positive", source);
  // Sizes no model has: refused before any table is sized by them (2^31 layers exhausted memory naming the tensors of
  // every layer; 2^62 heads overflowed the shapes: the bad-input sweep).
  const std::pair<const char*, int64_t> limits[] = {{"vocab_size", int64_t{1} << 24},         {"hidden_size", int64_t{1} << 18},
                                                    {"intermediate_size", int64_t{1} << 20},  {"num_hidden_layers", 4096},
                                                    {"num_attention_heads", 4096},            {"num_key_value_heads", 4096},
                                                    {"head_dim", 4096},                       {"max_position_embeddings", int64_t{1} << 24}};
  const int64_t values[] = {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                            c.head_dim, c.max_position_embeddings};
  for (size_t i = 0; i < std::size(values); ++i)
    if (values[i] > limits[i].second)
      fail("{}: field '{}' is {}, beyond any model this program can hold ({} at most)", source, limits[i].first, values[i], limits[i].second);

  if (c.model_type == "qwen3_moe") parse_moe(j, f, c);

  const bool attention_bias = f.boolean("attention_bias", false);
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  c.qkv_bias = c.model_type == "qwen2" || attention_bias;
  c.o_bias = c.model_type == "llama" && attention_bias;
  c.mlp_bias = c.model_type == "llama" && f.boolean("mlp_bias", false);

  if (c.hidden_act != "silu") fail("{}: hidden_act '{}' is not supported (supported: silu)", source, c.hidden_act);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", source, c.num_attention_heads, c.num_key_value_heads);
  }
  if (c.head_dim % 2 != 0) fail("{}: head_dim ({}) must be even for rotary embeddings", source, c.head_dim);
  if (c.rms_norm_eps < 0) fail("{}: field 'rms_norm_eps' must not be negative", source);
  if (c.use_sliding_window) fail("{}: use_sliding_window=true is not supported yet", source);
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  const std::string text = read_text_file(path);
  const json j = parse_json(text, path);
  return from_json(j, path);
}

json ModelConfig::to_json() const {
  json j;  // std::map-ordered keys: sorted, as Transformers' to_json_string(sort_keys=True)
  j["architectures"] = architectures;
  j["attention_dropout"] = attention_dropout;
  if (bos_token_id) j["bos_token_id"] = *bos_token_id; else j["bos_token_id"] = nullptr;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  else if (eos_token_ids.empty()) j["eos_token_id"] = nullptr;
  else j["eos_token_id"] = eos_token_ids;
  j["hidden_act"] = hidden_act;
  j["hidden_size"] = hidden_size;
  j["initializer_range"] = initializer_range;
  j["intermediate_size"] = intermediate_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["model_type"] = model_type;
  j["num_attention_heads"] = num_attention_heads;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_key_value_heads"] = num_key_value_heads;
  j["rms_norm_eps"] = rms_norm_eps;
  if (rope_scaling.rope_type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"rope_type", rope_scaling.rope_type},
                         {"factor", rope_scaling.factor},
                         {"low_freq_factor", rope_scaling.low_freq_factor},
                         {"high_freq_factor", rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["torch_dtype"] = torch_dtype;
  j["transformers_version"] = "4.51.0";
  j["use_cache"] = use_cache;
  j["vocab_size"] = vocab_size;
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  if (model_type == "qwen3" || model_type == "qwen2" || model_type == "qwen3_moe") {
    j["max_window_layers"] = max_window_layers;
    j["use_sliding_window"] = use_sliding_window;
    if (sliding_window) j["sliding_window"] = *sliding_window; else j["sliding_window"] = nullptr;
  }
  if (model_type == "qwen3" || model_type == "qwen3_moe") {
    j["head_dim"] = head_dim;
    j["attention_bias"] = qkv_bias;
  }
  if (model_type == "qwen3_moe") {
    j["num_experts"] = moe.num_experts;
    j["num_experts_per_tok"] = moe.num_experts_per_tok;
    j["moe_intermediate_size"] = moe.moe_intermediate_size;
    j["decoder_sparse_step"] = moe.decoder_sparse_step;
    j["mlp_only_layers"] = moe.mlp_only_layers;
    j["norm_topk_prob"] = moe.norm_topk_prob;
    j["router_aux_loss_coef"] = moe.router_aux_loss_coef;
    j["output_router_logits"] = moe.output_router_logits;
  }
  if (model_type == "llama") {
    j["head_dim"] = head_dim;
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = mlp_bias;
    j["pretraining_tp"] = 1;
  }
  return j;
}

}  // namespace trl

#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>

#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/io/model_config.h"
#include "trl/models/causal_lm.h"
#include "test_util.h"

namespace trl {
namespace {

using json = nlohmann::json;

// Qwen/Qwen3-0.6B's config.json (docs/MODELS.md).
const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

std::string error_of(const json& j) {
  try {
    ModelConfig::from_json(j, "dir/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, ParsesQwen3_06B) {
  ModelConfig c = ModelConfig::from_json(json::parse(kQwen3_06B), "config.json");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.head_dim, 128);  // set explicitly, not hidden/heads = 64
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(c.rope_scaling.rope_type, "default");
  // to_json writes back every field of the original with the same values.
  const json back = c.to_json();
  const json orig = json::parse(kQwen3_06B);
  for (auto it = orig.begin(); it != orig.end(); ++it) {
    ASSERT_TRUE(back.contains(it.key())) << it.key();
    if (it.value().is_number()) EXPECT_DOUBLE_EQ(back[it.key()].get<double>(), it.value().get<double>()) << it.key();
    else EXPECT_EQ(back[it.key()], it.value()) << it.key();
  }
  // ... and parses back to the same config.
  ModelConfig again = ModelConfig::from_json(back, "back");
  EXPECT_EQ(parameter_shapes(again), parameter_shapes(c));
}

TEST(ModelConfig, Qwen3_06B_ParameterShapes) {
  ModelConfig c = ModelConfig::from_json(json::parse(kQwen3_06B), "config.json");
  const auto p = parameter_shapes(c);
  EXPECT_EQ(p.size(), 1u + 28u * 11u + 1u);  // embed, 11 per layer, final norm; lm_head tied
  int64_t n = 0;
  for (const auto& [name, shape] : p) n += shape_numel(shape);
  EXPECT_EQ(n, 596049920);  // Qwen3-0.6B: 0.6B parameters, 0.44B without the embedding
  std::map<std::string, Shape> m(p.begin(), p.end());
  EXPECT_EQ(m.at("model.embed_tokens.weight"), (Shape{151936, 1024}));
  EXPECT_EQ(m.at("model.layers.27.self_attn.q_proj.weight"), (Shape{2048, 1024}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.k_proj.weight"), (Shape{1024, 1024}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.o_proj.weight"), (Shape{1024, 2048}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_norm.weight"), (Shape{128}));
  EXPECT_EQ(m.at("model.layers.0.mlp.down_proj.weight"), (Shape{1024, 3072}));
  EXPECT_FALSE(m.count("lm_head.weight"));
}

TEST(ModelConfig, Variants) {
  json q2 = json::parse(kQwen3_06B);
  q2["model_type"] = "qwen2";
  q2.erase("head_dim");
  ModelConfig c2 = ModelConfig::from_json(q2, "qwen2");
  EXPECT_FALSE(c2.qk_norm);
  EXPECT_TRUE(c2.qkv_bias);
  EXPECT_FALSE(c2.o_bias);
  EXPECT_EQ(c2.head_dim, 1024 / 16);
  std::map<std::string, Shape> m2;
  for (auto& [n, s] : parameter_shapes(c2)) m2[n] = s;
  EXPECT_TRUE(m2.count("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(m2.count("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_FALSE(m2.count("model.layers.0.self_attn.q_norm.weight"));

  json ll = json::parse(kQwen3_06B);
  ll["model_type"] = "llama";
  ll["rope_theta"] = 500000.0;
  ll["head_dim"] = 64;
  ll["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8192}};
  ModelConfig cl = ModelConfig::from_json(ll, "llama");
  EXPECT_FALSE(cl.qk_norm);
  EXPECT_FALSE(cl.qkv_bias);
  EXPECT_EQ(cl.rope_scaling.rope_type, "llama3");
  // llama3 scaling: high frequencies (short wavelengths) unchanged, low ones divided by factor, smooth in between.
  ModelConfig plain = cl;
  plain.rope_scaling = RopeScaling{};
  const auto scaled = rope_inv_freq(cl), base = rope_inv_freq(plain);
  ASSERT_EQ(scaled.size(), 32u);
  for (size_t j = 0; j < base.size(); ++j) {
    const double wavelen = 2 * M_PI / base[j];
    if (wavelen < 8192.0 / 4.0) EXPECT_EQ(scaled[j], base[j]) << j;
    else if (wavelen > 8192.0) EXPECT_FLOAT_EQ(scaled[j], base[j] / 32.0f) << j;
    else EXPECT_TRUE(scaled[j] < base[j] && scaled[j] > base[j] / 32.0f) << j;
  }
  EXPECT_EQ(base[0], 1.0f);
  EXPECT_FLOAT_EQ(base[1], static_cast<float>(std::pow(500000.0, -2.0 / 64)));
}

TEST(ModelConfig, TransformersV5RopeParameters) {
  json j = json::parse(kQwen3_06B);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000.0}};
  EXPECT_EQ(ModelConfig::from_json(j, "v5").rope_theta, 5000.0);
}

TEST(ModelConfig, ClearErrors) {
  json j = json::parse(kQwen3_06B);
  // Sizes no model has are refused before anything is sized by them (2^31 layers exhausted memory: issue 37's sweep).
  for (const char* key : {"num_hidden_layers", "num_attention_heads", "vocab_size", "hidden_size"}) {
    json big = j;
    big[key] = int64_t{1} << 31;
    const std::string e = error_of(big);
    EXPECT_NE(e.find(std::string("field '") + key + "' is 2147483648, beyond any model this program can hold"), std::string::npos) << e;
  }
  j["hidden_size"] = "1024";
  std::string e = error_of(j);
  EXPECT_NE(e.find("dir/config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("'hidden_size'"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;

  j = json::parse(kQwen3_06B);
  j["model_type"] = "gpt_neox";
  e = error_of(j);
  EXPECT_NE(e.find("gpt_neox"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3, qwen2, llama"), std::string::npos) << e;

  j = json::parse(kQwen3_06B);
  j.erase("vocab_size");
  EXPECT_NE(error_of(j).find("missing required field 'vocab_size'"), std::string::npos);

  j = json::parse(kQwen3_06B);
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("multiple of num_key_value_heads"), std::string::npos);

  j = json::parse(kQwen3_06B);
  j["tie_word_embeddings"] = 1;
  EXPECT_NE(error_of(j).find("'tie_word_embeddings' must be true or false"), std::string::npos);

  j = json::parse(kQwen3_06B);
  j["hidden_act"] = "gelu";
  EXPECT_NE(error_of(j).find("gelu"), std::string::npos);

  j = json::parse(kQwen3_06B);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("yarn"), std::string::npos);

  test::TempDir dir;
  write_text_file_atomic(dir.file("config.json"), "{\"model_type\": \"qwen3\",,}");
  try {
    ModelConfig::load(dir.file("config.json"));
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("not valid JSON"), std::string::npos);
  }
}

}  // namespace
}  // namespace trl

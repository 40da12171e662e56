#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/backend/cpu/cpu_backend.h"
#include "trl/backend/registry.h"
#include "trl/models/causal_lm.h"
#include "trl/models/init.h"
#include "trl/models/score.h"
#include "test_util.h"

namespace trl {
namespace {

namespace fs = std::filesystem;

// vocab_size 0: the preset's (Qwen3's 151936); test::kCutVocab where the vocabulary's size is not what a test checks.
CausalLM tiny_model(DType dtype = DType::F32, int64_t vocab_size = 0) {
  ModelConfig c = preset_config("tiny", dtype);
  if (vocab_size > 0) c.vocab_size = vocab_size;
  return CausalLM::from_weights(c, init_weights(c, dtype, 7, 0.1, true));
}

Tensor ids_tensor(const std::vector<std::vector<int32_t>>& rows, bool left, Tensor* mask_out) {
  size_t T = 0;
  for (const auto& r : rows) T = std::max(T, r.size());
  const int64_t B = static_cast<int64_t>(rows.size());
  Tensor ids = Tensor::zeros(DType::I32, {B, static_cast<int64_t>(T)});
  Tensor mask = Tensor::zeros(DType::I32, {B, static_cast<int64_t>(T)});
  for (int64_t b = 0; b < B; ++b) {
    const auto& r = rows[static_cast<size_t>(b)];
    const size_t off = left ? T - r.size() : 0;
    for (size_t t = 0; t < r.size(); ++t) {
      ids.mutable_data_as<int32_t>()[b * static_cast<int64_t>(T) + static_cast<int64_t>(off + t)] = r[t];
      mask.mutable_data_as<int32_t>()[b * static_cast<int64_t>(T) + static_cast<int64_t>(off + t)] = 1;
    }
  }
  *mask_out = mask;
  return ids;
}

// Invariant: a row's logits do not depend on the padding around it (left or right) or on its batch-mates.
TEST(CausalLM, PaddedBatchEqualsEachRowAlone) {
  const CausalLM model = tiny_model();
  auto backend = make_reference_backend();
  const std::vector<std::vector<int32_t>> rows = {{5, 6, 7, 8, 9, 10}, {11, 12}, {151643, 3, 4, 5}};
  const int64_t V = model.config().vocab_size;
  for (bool left : {false, true}) {
    Batch batch;
    batch.input_ids = ids_tensor(rows, left, &batch.attention_mask);
    const Tensor logits = model.forward(batch, *backend);
    const int64_t T = batch.input_ids.size(1);
    for (size_t b = 0; b < rows.size(); ++b) {
      Batch one;
      one.input_ids = Tensor::from_i32(rows[b], {1, static_cast<int64_t>(rows[b].size())});
      const Tensor alone = model.forward(one, *backend);
      const int64_t off = left ? T - static_cast<int64_t>(rows[b].size()) : 0;
      for (size_t t = 0; t < rows[b].size(); ++t) {
        const float* x = alone.data_as<float>() + static_cast<int64_t>(t) * V;
        const float* y = logits.data_as<float>() + (static_cast<int64_t>(b) * T + off + static_cast<int64_t>(t)) * V;
        for (int64_t v = 0; v < V; v += 97) ASSERT_NEAR(x[v], y[v], 1e-5) << "left=" << left << " b=" << b << " t=" << t;
      }
    }
  }
}

// Packing: sequences packed into one row with segment ids give the logits of each sequence alone, on both backends.
TEST(CausalLM, PackedSequencesEqualSeparateOnes) {
  const CausalLM model = tiny_model();
  const std::vector<int32_t> a = {5, 6, 7}, b = {8, 9};
  Batch packed;
  packed.input_ids = Tensor::from_i32(std::vector<int32_t>{5, 6, 7, 8, 9, 0}, {1, 6});
  packed.attention_mask = Tensor::from_i32(std::vector<int32_t>{1, 1, 1, 2, 2, 0}, {1, 6});
  EXPECT_EQ(default_position_ids(packed.attention_mask).to_i64_vector(), (std::vector<int64_t>{0, 1, 2, 0, 1, 1}));
  const int64_t V = model.config().vocab_size;
  for (auto* make : {&make_reference_backend, &make_cpu_backend}) {
    auto backend = make();
    const Tensor lp = model.forward(packed, *backend);
    Batch one;
    one.input_ids = Tensor::from_i32(a, {1, 3});
    const Tensor la = model.forward(one, *backend);
    one.input_ids = Tensor::from_i32(b, {1, 2});
    const Tensor lb = model.forward(one, *backend);
    for (int64_t v = 0; v < 3 * V; v += 31) ASSERT_NEAR(lp.data_as<float>()[v], la.data_as<float>()[v], 1e-5) << backend->name();
    for (int64_t v = 0; v < 2 * V; v += 31) ASSERT_NEAR(lp.data_as<float>()[3 * V + v], lb.data_as<float>()[v], 1e-5) << backend->name();
  }
}

// Causality: the logits at position t do not change when later tokens change.
TEST(CausalLM, IsCausal) {
  const CausalLM model = tiny_model();
  auto backend = make_reference_backend();
  Batch a, b;
  a.input_ids = Tensor::from_i32(std::vector<int32_t>{1, 2, 3, 4}, {1, 4});
  b.input_ids = Tensor::from_i32(std::vector<int32_t>{1, 2, 3, 999}, {1, 4});
  const Tensor la = model.forward(a, *backend), lb = model.forward(b, *backend);
  const int64_t V = model.config().vocab_size;
  for (int64_t i = 0; i < 3 * V; ++i) ASSERT_EQ(la.data_as<float>()[i], lb.data_as<float>()[i]);
  double diff = 0;
  for (int64_t i = 3 * V; i < 4 * V; ++i) diff += std::fabs(la.data_as<float>()[i] - lb.data_as<float>()[i]);
  EXPECT_GT(diff, 1e-3);
}

TEST(CausalLM, ScoreMatchesLogSoftmaxAndIgnoresBatching) {
  const CausalLM model = tiny_model(DType::F32, test::kCutVocab);
  auto backend = make_reference_backend();
  const std::vector<std::vector<int32_t>> seqs = {{5, 6, 7, 8}, {9}, {10, 11}};
  const auto batched = score_sequences(model, seqs, *backend, 3);
  const auto single = score_sequences(model, seqs, *backend, 1);
  ASSERT_EQ(batched.size(), 3u);
  EXPECT_EQ(batched[1].n_scored, 0);
  EXPECT_EQ(batched[1].perplexity(), 1.0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_NEAR(batched[i].nll, single[i].nll, 1e-6);
  }
  // By hand for the first sequence.
  Batch b;
  b.input_ids = Tensor::from_i32(seqs[0], {1, 4});
  const Tensor logits = model.forward(b, *backend);
  const int64_t V = model.config().vocab_size;
  double nll = 0;
  for (int t = 0; t < 3; ++t) {
    const float* row = logits.data_as<float>() + t * V;
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]));
    nll -= row[seqs[0][static_cast<size_t>(t) + 1]] - std::log(z);
  }
  EXPECT_NEAR(batched[0].nll, nll, 1e-6);
  EXPECT_NEAR(batched[0].perplexity(), std::exp(nll / 3), 1e-6 * std::exp(nll / 3));  // log-probs are f32 (token_logprobs)
}

// Scoring runs cached programs of fixed shapes: three batches (the last one short) of sequences within one bucket
// compile a single program, and the CPU backend's scores equal the reference's.
TEST(CausalLM, ScoreCompilesOneProgramPerBucket) {
  const CausalLM model = tiny_model(DType::F32, test::kCutVocab);
  const std::vector<std::vector<int32_t>> seqs = {{5, 6, 7, 8}, {9, 3}, {10, 11, 12}, {1, 2, 3, 4, 5, 6, 7}, {42, 43}};
  auto cpu = make_backend("cpu");
  setenv("TRL_LOG_RECOMPILES", "1", 1);
  testing::internal::CaptureStderr();
  const auto got = score_sequences(model, seqs, *cpu, 2);
  const std::string log = testing::internal::GetCapturedStderr();
  unsetenv("TRL_LOG_RECOMPILES");
  size_t compiles = 0;
  for (size_t at = log.find("compiling program"); at != std::string::npos; at = log.find("compiling program", at + 1)) ++compiles;
  EXPECT_EQ(compiles, 1u) << log;
  auto reference = make_backend("reference");
  const auto want = score_sequences(model, seqs, *reference, 1);
  ASSERT_EQ(got.size(), seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(got[i].n_scored, static_cast<int64_t>(seqs[i].size()) - 1);
    ASSERT_TRUE(std::isfinite(got[i].nll));
    EXPECT_NEAR(got[i].nll, want[i].nll, 1e-4 * std::max(1.0, std::fabs(want[i].nll))) << i;
  }
}

TEST(CausalLM, BadInputsAreClearErrors) {
  const CausalLM model = tiny_model();
  auto backend = make_reference_backend();
  Batch b;
  b.input_ids = Tensor::from_i32(std::vector<int32_t>{1, 151936}, {1, 2});
  try {
    model.forward(b, *backend);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input_ids[0][1] = 151936"), std::string::npos) << e.what();
  }
  b.input_ids = Tensor::from_i32(std::vector<int32_t>{1, 2}, {1, 2});
  b.attention_mask = Tensor::from_i32(std::vector<int32_t>{1, 1, 1}, {1, 3});
  EXPECT_THROW(model.forward(b, *backend), Error);
  EXPECT_THROW(score_sequences(model, {{}}, *backend), Error);
}

TEST(CausalLM, MissingOrMisshapenWeightsAreNamed) {
  ModelConfig c = preset_config("tiny", DType::F32);
  TensorMap w = init_weights(c, DType::F32, 1, 0.02, false);
  TensorMap missing = w;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  try {
    CausalLM::from_weights(c, missing, "ckpt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'model.layers.1.mlp.up_proj.weight'"), std::string::npos) << e.what();
  }
  TensorMap wrong = w;
  wrong["model.norm.weight"] = Tensor::zeros(DType::F32, {63});
  try {
    CausalLM::from_weights(c, wrong, "ckpt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.norm.weight' has shape [63]"), std::string::npos) << e.what();
  }
}

TEST(CausalLM, SaveLoadRoundTripAndDtypeConversion) {
  test::TempDir dir;
  InitOptions o;
  o.preset = "tiny";
  o.dtype = DType::BF16;
  o.seed = 3;
  const CausalLM m = init_model(o, dir.path());
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(dir.file(f))) << f;
  }
  // Tied embeddings are stored once, as Transformers does.
  EXPECT_FALSE(Checkpoint::open(dir.path()).contains("lm_head.weight"));
  EXPECT_EQ(nlohmann::json::parse(read_text_file(dir.file("config.json")))["torch_dtype"], "bfloat16");
  const CausalLM back = CausalLM::from_pretrained(dir.path());
  EXPECT_EQ(back.dtype(), DType::BF16);
  for (const auto& [name, t] : m.weights()) {
    const Tensor& r = back.weights().at(name);
    ASSERT_EQ(std::memcmp(r.data(), t.data(), t.nbytes()), 0) << name;
  }
  LoadOptions lo;
  lo.dtype = DType::F32;
  const CausalLM up = CausalLM::from_pretrained(dir.path(), lo);
  EXPECT_EQ(up.dtype(), DType::F32);
  EXPECT_EQ(up.weights().at("model.norm.weight").to_f32_vector(), m.weights().at("model.norm.weight").to_f32_vector());
  // Seeds: same seed, same bytes; another seed, other bytes.
  ModelConfig c = preset_config("tiny", DType::F32);
  EXPECT_EQ(init_weights(c, DType::F32, 5, 0.02, false).at("model.embed_tokens.weight").to_f32_vector(),
            init_weights(c, DType::F32, 5, 0.02, false).at("model.embed_tokens.weight").to_f32_vector());
  EXPECT_NE(init_weights(c, DType::F32, 5, 0.02, false).at("model.embed_tokens.weight").to_f32_vector(),
            init_weights(c, DType::F32, 6, 0.02, false).at("model.embed_tokens.weight").to_f32_vector());
}

TEST(CausalLM, InitStatistics) {
  ModelConfig c = preset_config("small", DType::F32);
  TensorMap w = init_weights(c, DType::F32, 11, 0.02, false);
  const auto v = w.at("model.layers.0.mlp.gate_proj.weight").to_f32_vector();
  double sum = 0, sq = 0;
  for (float x : v) sum += x, sq += static_cast<double>(x) * x;
  const double mean = sum / static_cast<double>(v.size()), std = std::sqrt(sq / static_cast<double>(v.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(std, 0.02, 2e-4);
  for (float x : w.at("model.layers.0.input_layernorm.weight").to_f32_vector()) EXPECT_EQ(x, 1.0f);
}

// The qwen3-0.6b preset writes exactly the real model's tensor names, shapes and config fields, and loads back.
TEST(CausalLM, Qwen3_06B_PresetLooksLikeTheRealModel) {
  test::TempDir dir;
  InitOptions o;
  o.preset = "qwen3-0.6b";
  o.dtype = DType::BF16;
  const CausalLM m = init_model(o, dir.path());
  EXPECT_EQ(m.num_parameters(), 596049920);
  const auto cfg = nlohmann::json::parse(read_text_file(dir.file("config.json")));
  const nlohmann::json expected = {{"architectures", {"Qwen3ForCausalLM"}}, {"attention_bias", false}, {"attention_dropout", 0.0},
                                   {"bos_token_id", 151643}, {"eos_token_id", 151645}, {"head_dim", 128}, {"hidden_act", "silu"},
                                   {"hidden_size", 1024}, {"initializer_range", 0.02}, {"intermediate_size", 3072},
                                   {"max_position_embeddings", 40960}, {"max_window_layers", 28}, {"model_type", "qwen3"},
                                   {"num_attention_heads", 16}, {"num_hidden_layers", 28}, {"num_key_value_heads", 8},
                                   {"rms_norm_eps", 1e-6}, {"rope_scaling", nullptr}, {"rope_theta", 1000000.0},
                                   {"sliding_window", nullptr}, {"tie_word_embeddings", true}, {"torch_dtype", "bfloat16"},
                                   {"use_cache", true}, {"use_sliding_window", false}, {"vocab_size", 151936}};
  for (auto it = expected.begin(); it != expected.end(); ++it) EXPECT_EQ(cfg.at(it.key()), it.value()) << it.key();
  Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.names().size(), 310u);
  EXPECT_EQ(ck.info("model.embed_tokens.weight").shape, (Shape{151936, 1024}));
  EXPECT_EQ(ck.info("model.layers.27.mlp.gate_proj.weight").shape, (Shape{3072, 1024}));
  EXPECT_EQ(ck.info("model.layers.13.self_attn.k_norm.weight").shape, (Shape{128}));
  EXPECT_EQ(ck.info("model.layers.0.self_attn.q_proj.weight").dtype, DType::BF16);
  const CausalLM back = CausalLM::from_pretrained(dir.path());
  EXPECT_EQ(back.num_parameters(), 596049920);
  EXPECT_EQ(back.weights().at("model.embed_tokens.weight").storage_kind(), StorageKind::Mapped);  // zero-copy load
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// The qwen3-1.7b preset (the model the seed shards with tp_size=2, fsdp_size=2) has Qwen/Qwen3-1.7B's widths: 1.72 B
// parameters, 1.41 B of them outside the tied embedding.
TEST(CausalLM, Qwen3_17B_PresetHasTheRealModelsShapes) {
  const ModelConfig c = preset_config("qwen3-1.7b", DType::BF16);
  int64_t total = 0;
  std::map<std::string, Shape> shapes;
  for (const auto& [name, shape] : parameter_shapes(c)) total += shape_numel(shape), shapes[name] = shape;
  EXPECT_EQ(total, 1720574976);
  EXPECT_EQ(total - shape_numel(shapes.at("model.embed_tokens.weight")), 1409410048);
  EXPECT_EQ(shapes.size(), 310u);
  EXPECT_EQ(shapes.at("model.layers.27.mlp.gate_proj.weight"), (Shape{6144, 2048}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.k_proj.weight"), (Shape{1024, 2048}));
  EXPECT_TRUE(c.tie_word_embeddings);
}

}  // namespace
}  // namespace trl

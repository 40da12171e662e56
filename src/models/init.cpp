#include "trl/models/init.h"

#include <atomic>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "assets/assets.h"
#include "trl/core/error.h"
#include "core/fs.h"
#include "core/rng.h"

namespace trl {

namespace fs = std::filesystem;

std::vector<std::string> model_presets() { return {"tiny", "small", "qwen3-0.6b", "qwen3-1.7b", "tiny-moe", "qwen3-30b-a3b"}; }

ModelConfig preset_config(const std::string& preset, DType dtype) {
  ModelConfig c;
  c.model_type = "qwen3";
  c.architectures = {"Qwen3ForCausalLM"};
  c.vocab_size = 151936;
  c.max_position_embeddings = 40960;
  c.rope_theta = 1000000.0;
  c.rms_norm_eps = 1e-6;
  c.initializer_range = 0.02;
  c.tie_word_embeddings = true;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645};
  c.use_cache = true;
  c.use_sliding_window = false;
  c.qk_norm = true;
  c.torch_dtype = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  if (preset == "tiny") {
    c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2, c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
  } else if (preset == "small") {
    c.hidden_size = 256, c.intermediate_size = 768, c.num_hidden_layers = 4, c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64;
  } else if (preset == "qwen3-0.6b") {
    c.hidden_size = 1024, c.intermediate_size = 3072, c.num_hidden_layers = 28, c.num_attention_heads = 16, c.num_key_value_heads = 8, c.head_dim = 128;
  } else if (preset == "qwen3-1.7b") {  // Qwen/Qwen3-1.7B's config.json (tied embeddings, as the 0.6B)
    c.hidden_size = 2048, c.intermediate_size = 6144, c.num_hidden_layers = 28, c.num_attention_heads = 16, c.num_key_value_heads = 8, c.head_dim = 128;
  } else if (preset == "tiny-moe") {  // tiny's attention, 8 experts of width 32, 2 per token
    c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2, c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
    c.model_type = "qwen3_moe", c.architectures = {"Qwen3MoeForCausalLM"};
    c.moe.num_experts = 8, c.moe.num_experts_per_tok = 2, c.moe.moe_intermediate_size = 32, c.moe.norm_topk_prob = true;
  } else if (preset == "qwen3-30b-a3b") {  // Qwen/Qwen3-30B-A3B's config.json: 128 experts of width 768, 8 per token, untied
    c.hidden_size = 2048, c.intermediate_size = 6144, c.num_hidden_layers = 48, c.num_attention_heads = 32, c.num_key_value_heads = 4, c.head_dim = 128;
    c.model_type = "qwen3_moe", c.architectures = {"Qwen3MoeForCausalLM"};
    c.moe.num_experts = 128, c.moe.num_experts_per_tok = 8, c.moe.moe_intermediate_size = 768, c.moe.norm_topk_prob = true;
    c.tie_word_embeddings = false;
  } else {
    fail("unknown preset '{}' (choose one of: tiny, small, qwen3-0.6b, qwen3-1.7b, tiny-moe, qwen3-30b-a3b)", preset);
  }
  c.max_window_layers = c.num_hidden_layers;
  return c;
}

static uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  SplitMix64 mix(seed ^ h);
  return mix.next();
}

namespace {

// Fills `t` from its own stream: N(0, std) for matrices, 1 for norms (1 + N(0, std) with randomize_norms), 0 for
// biases (N(0, std) with randomize_norms).
template <typename Store>
void fill(Tensor& t, const std::string& name, uint64_t seed, double std, bool randomize_norms, Store store) {
  SplitMix64 rng(name_seed(seed, name));
  const bool is_norm = name.find("norm.weight") != std::string::npos;
  const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v;
    if (is_norm) v = randomize_norms ? 1.0 + std * rng.normal() : 1.0;
    else if (is_bias) v = randomize_norms ? std * rng.normal() : 0.0;
    else v = std * rng.normal();
    store(i, v);
  }
}

}  // namespace

TensorMap init_weights(const ModelConfig& config, DType dtype, uint64_t seed, double std, bool randomize_norms) {
  if (!dtype_is_float(dtype)) fail("init_weights: dtype must be f32, bf16 or f16");
  const auto shapes = parameter_shapes(config);
  std::vector<Tensor> tensors(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) tensors[i] = Tensor::zeros(dtype, shapes[i].second);
  // Tensors are independent streams, so they are filled in parallel with the same result on any thread count.
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < shapes.size();) {
      Tensor& t = tensors[i];
      const std::string& name = shapes[i].first;
      if (dtype == DType::F32) {
        float* p = t.mutable_data_as<float>();
        fill(t, name, seed, std, randomize_norms, [p](int64_t k, double v) { p[k] = static_cast<float>(v); });
      } else if (dtype == DType::BF16) {
        uint16_t* p = t.mutable_data_as<uint16_t>();
        fill(t, name, seed, std, randomize_norms, [p](int64_t k, double v) { p[k] = f32_to_bf16(static_cast<float>(v)); });
      } else {
        uint16_t* p = t.mutable_data_as<uint16_t>();
        fill(t, name, seed, std, randomize_norms, [p](int64_t k, double v) { p[k] = f32_to_f16(static_cast<float>(v)); });
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned n_threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  for (unsigned k = 1; k < n_threads; ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  TensorMap weights;
  for (size_t i = 0; i < shapes.size(); ++i) weights.emplace(shapes[i].first, std::move(tensors[i]));
  return weights;
}

namespace {

// The bundled tokenizer's sizes: byte-level BPE over 256 byte tokens, then one token per merge (id = 256 + rank),
// then the special (added) tokens.
constexpr int64_t kByteTokens = 256;
constexpr int64_t kQwen3Ordinary = 151643, kQwen3Special = 26;

// The special tokens' ids in a cut vocabulary: right after the kept ordinary tokens, in their order.
int64_t cut_id(int64_t id, int64_t vocab_size) {
  return id < kQwen3Ordinary ? id : id - kQwen3Ordinary + (vocab_size - kQwen3Special);
}

// tokenizer.json and tokenizer_config.json cut to vocab_size tokens (InitOptions::vocab_size).
std::pair<std::string, std::string> cut_tokenizer(int64_t vocab_size) {
  const int64_t ordinary = vocab_size - kQwen3Special;
  // nlohmann::json, not ordered_json: an ordered_json object finds a key by a linear search, which makes parsing the
  // 151643-token vocabulary quadratic (20 s). The files' key order carries no meaning.
  nlohmann::json t = nlohmann::json::parse(asset("tokenizer.json"));
  auto& model = t.at("model");
  nlohmann::json vocab = nlohmann::json::object();
  for (const auto& [token, id] : model.at("vocab").items())
    if (id.get<int64_t>() < ordinary) vocab[token] = id;
  model["vocab"] = std::move(vocab);
  auto& merges = model.at("merges");
  merges.erase(merges.begin() + (ordinary - kByteTokens), merges.end());
  for (auto& added : t.at("added_tokens")) added["id"] = cut_id(added.at("id").get<int64_t>(), vocab_size);
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(asset("tokenizer_config.json"));  // small: order kept
  nlohmann::ordered_json decoder = nlohmann::ordered_json::object();
  for (const auto& [id, token] : config.at("added_tokens_decoder").items())
    decoder[std::to_string(cut_id(std::stoll(id), vocab_size))] = token;
  config["added_tokens_decoder"] = std::move(decoder);
  return {t.dump(), config.dump(2)};
}

}  // namespace

int64_t min_cut_vocab_size() { return 512; }
int64_t max_cut_vocab_size() { return kQwen3Ordinary + kQwen3Special; }

void write_tokenizer_files(const std::string& dir, int64_t vocab_size) {
  if (vocab_size <= 0) {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      write_text_file_atomic((fs::path(dir) / name).string(), asset(name));
    }
    return;
  }
  const auto [tokenizer, config] = cut_tokenizer(vocab_size);
  write_text_file_atomic((fs::path(dir) / "tokenizer.json").string(), tokenizer);
  write_text_file_atomic((fs::path(dir) / "tokenizer_config.json").string(), config + "\n");
}

CausalLM init_model(const InitOptions& options, const std::string& out_dir) {
  ModelConfig config = preset_config(options.preset, options.dtype);
  if (options.num_hidden_layers > 0) config.num_hidden_layers = config.max_window_layers = options.num_hidden_layers;
  const int64_t v = options.vocab_size;
  if (v != 0 && (v < min_cut_vocab_size() || v > max_cut_vocab_size()))
    fail("init-model: vocab_size {} is out of range: a cut of the Qwen3 tokenizer has {} to {} tokens (0 keeps the preset's {})", v,
         min_cut_vocab_size(), max_cut_vocab_size(), config.vocab_size);
  auto id = [v](int64_t qwen3_id) { return v > 0 ? cut_id(qwen3_id, v) : qwen3_id; };
  if (v > 0) {
    config.vocab_size = v;
    config.bos_token_id = id(151643);
    config.eos_token_ids = {id(151645)};
  }
  const double std = options.initializer_range > 0 ? options.initializer_range : config.initializer_range;
  config.initializer_range = std;
  CausalLM model = CausalLM::from_weights(config, init_weights(config, options.dtype, options.seed, std, options.randomize_norms),
                                          "init-model " + options.preset);
  model.save_pretrained(out_dir, options.max_shard_bytes);
  // generation_config.json as Qwen3-0.6B ships it.
  nlohmann::json gen = {{"bos_token_id", id(151643)}, {"do_sample", true},  {"eos_token_id", {id(151645), id(151643)}},
                        {"pad_token_id", id(151643)}, {"temperature", 0.6}, {"top_k", 20},
                        {"top_p", 0.95},              {"transformers_version", "4.51.0"}};
  write_text_file_atomic((fs::path(out_dir) / "generation_config.json").string(), gen.dump(2) + "\n");
  write_tokenizer_files(out_dir, v);
  return model;
}

}  // namespace trl

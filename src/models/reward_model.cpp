#include "trl/models/reward_model.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "core/json_text.h"
#include "core/rng.h"
#include "trl/backend/program_cache.h"
#include "trl/core/error.h"
#include "trl/io/hub.h"
#include "trl/io/safetensors.h"
#include "trl/models/lora.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/runtime/shapes.h"

namespace trl {

namespace fs = std::filesystem;

namespace {

std::string classifier_architecture(const ModelConfig& c) {
  if (c.model_type == "qwen3") return "Qwen3ForSequenceClassification";
  if (c.model_type == "qwen2") return "Qwen2ForSequenceClassification";
  if (c.model_type == "llama") return "LlamaForSequenceClassification";
  fail("reward model: model_type '{}' has no sequence-classification architecture here (qwen3, qwen2 or llama)", c.model_type);
}

}  // namespace

bool is_sequence_classification_config(const std::string& dir) {
  const fs::path p = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(p)) return false;
  const nlohmann::json j = nlohmann::json::parse(read_text_file(p.string()), nullptr, false);
  if (!j.is_object() || !j.contains("architectures") || !j["architectures"].is_array()) return false;
  for (const auto& a : j["architectures"])
    if (a.is_string() && a.get<std::string>().ends_with("ForSequenceClassification")) return true;
  return false;
}

Tensor new_score_head(const ModelConfig& c, DType dtype, uint64_t seed) {
  std::vector<float> w(static_cast<size_t>(c.hidden_size));
  SplitMix64 rng(seed * 0x9E3779B97F4A7C15ull + 0x5C03E);
  for (float& x : w) x = static_cast<float>(c.initializer_range * rng.normal());
  const Tensor t = Tensor::from_f32(w, {1, c.hidden_size});
  return dtype == DType::F32 ? t : t.to(dtype);
}

bool is_sequence_classification_adapter(const std::string& dir) {
  if (!fs::is_directory(dir) || !is_adapter_dir(dir)) return false;
  const nlohmann::json j = nlohmann::json::parse(read_text_file((fs::path(dir) / "adapter_config.json").string()), nullptr, false);
  return j.is_object() && j.contains("task_type") && j["task_type"].is_string() && j["task_type"].get<std::string>() == "SEQ_CLS";
}

RewardModel reward_model_from_adapter(const CausalLM& adapted, const std::string& adapter_dir, std::optional<int32_t> pad) {
  const LoraAdapter a = load_adapter(adapter_dir, adapted.config());
  if (!a.weights.count("score.weight"))
    fail("{}: a SEQ_CLS adapter without base_model.model.score.weight: the reward head was not saved with it (modules_to_save score)", adapter_dir);
  std::optional<int32_t> id = pad;
  if (!id && adapted.config().pad_token_id) id = static_cast<int32_t>(*adapted.config().pad_token_id);
  if (!id && fs::is_regular_file(fs::path(adapter_dir) / "tokenizer.json")) id = Tokenizer::from_pretrained(adapter_dir).pad_token_id();
  if (!id) fail("{}: no pad token id (the reward is read at the last token that is not the pad token): give pad_token_id", adapter_dir);
  CausalLM m = adapted.merged();
  Tensor score = a.weights.at("score.weight");
  if (score.dtype() != m.dtype()) score = score.to(m.dtype());
  return RewardModel{std::move(m), std::move(score), *id, false};
}

RewardModel load_reward_model(const std::string& name_or_path, const LoadOptions& o, std::optional<int32_t> pad, uint64_t seed) {
  // A reward adapter (`trl reward --use_peft`): its base with the adapter merged, and the score head it saved.
  if (is_sequence_classification_adapter(name_or_path)) return reward_model_from_adapter(CausalLM::from_pretrained(name_or_path, o), name_or_path, pad);
  const std::string dir = resolve_model_dir(name_or_path, o.revision);
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!is_sequence_classification_config(dir)) {
    if (!pad) fail("reward model {}: a causal-LM checkpoint needs a pad token id for pooling (the tokenizer's pad_token)", dir);
    CausalLM m = CausalLM::from_pretrained(dir, o);
    Tensor head = new_score_head(m.config(), m.dtype(), seed);
    return RewardModel{std::move(m), std::move(head), *pad, true};
  }
  const nlohmann::json j = parse_json(read_text_file(config_path), config_path);
  if (j.contains("id2label") && j["id2label"].is_object() && j["id2label"].size() != 1)
    fail("{}: field 'id2label' has {} labels; a reward model has one (num_labels 1): train it with trl reward from a causal-LM "
         "checkpoint, or give a checkpoint saved with num_labels=1",
         config_path, j["id2label"].size());
  if (j.contains("num_labels") && j["num_labels"].is_number_integer() && j["num_labels"].get<int64_t>() != 1)
    fail("{}: field 'num_labels' is {}; a reward model has one label", config_path, j["num_labels"].get<int64_t>());
  const Checkpoint ck = Checkpoint::open(dir);
  if (!ck.contains("score.weight")) fail("{}: a sequence-classification checkpoint without score.weight", dir);
  Tensor score = ck.get("score.weight");
  if (!dtype_is_float(score.dtype())) fail("{}: tensor 'score.weight' has dtype {}; weights must be floating point", dir, dtype_name(score.dtype()));
  ModelConfig probe = ModelConfig::load(config_path);
  if (score.dim() != 2 || score.size(0) != 1 || score.size(1) != probe.hidden_size)
    fail("{}: score.weight is {}, a reward model's is [1, {}] (num_labels 1)", dir, shape_str(score.shape()), probe.hidden_size);
  std::optional<int32_t> config_pad;
  if (j.contains("pad_token_id") && j["pad_token_id"].is_number_integer()) config_pad = j["pad_token_id"].get<int32_t>();
  if (!config_pad && !pad) fail("{}: field 'pad_token_id' is missing; the reward is read at the last token that is not the pad token", config_path);
  CausalLM m = CausalLM::from_pretrained(dir, o);
  if (score.dtype() != m.dtype()) score = score.to(m.dtype());
  return RewardModel{std::move(m), std::move(score), config_pad.value_or(pad.value_or(0)), false};
}

void save_reward_model(const std::string& dir, const ModelConfig& config, const TensorMap& weights, int32_t pad, DType dtype) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create the folder: {}", dir, ec.message());
  if (!weights.count("score.weight")) fail("save_reward_model: no score.weight");
  TensorMap out;
  for (const auto& [name, w] : weights)
    if (name != "lm_head.weight") out[name] = w.dtype() == dtype ? w : w.to(dtype);
  save_checkpoint(dir, out, 5'000'000'000ull);
  ModelConfig c = config;
  c.architectures = {classifier_architecture(config)};
  c.torch_dtype = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  c.pad_token_id = pad;
  nlohmann::json j = c.to_json();
  j["id2label"] = {{"0", "LABEL_0"}};
  j["label2id"] = {{"LABEL_0", 0}};
  write_text_file_atomic((fs::path(dir) / "config.json").string(), j.dump(2) + "\n");
}

int64_t pooled_position(const int32_t* ids, int64_t length, int32_t pad) {
  for (int64_t t = length - 1; t >= 0; --t)
    if (ids[t] != pad) return t;
  return 0;
}

std::vector<double> reward_scores(const RewardModel& m, const std::vector<std::vector<int32_t>>& sequences, Backend& backend, int64_t batch_size) {
  ProgramCache programs(backend);
  return reward_scores(m, sequences, programs, batch_size);
}

std::vector<double> pooled_scores(Backend& backend, const Tensor& scores, const std::vector<int64_t>& positions) {
  const int64_t R = scores.size(0);
  if (static_cast<int64_t>(positions.size()) != R) fail("pooled_scores: {} positions for {} rows of scores", positions.size(), R);
  std::vector<Backend::Span> spans;
  for (int64_t r = 0; r < R; ++r) spans.push_back({r, positions[static_cast<size_t>(r)], positions[static_cast<size_t>(r)] + 1});
  return backend.span_sums(scores, nullptr, nullptr, spans);
}

TensorMap reward_weights(const RewardModel& m, Backend& backend) {
  TensorMap in = m.backbone.weights();
  in.erase("lm_head.weight");
  in["score.weight"] = m.score;
  return to_backend(backend, in);
}

std::vector<double> reward_scores(const RewardModel& m, const std::vector<std::vector<int32_t>>& sequences, ProgramCache& programs, int64_t batch_size,
                                  const TensorMap* weights) {
  Backend& backend = programs.backend();
  const TensorMap own = weights == nullptr ? reward_weights(m, backend) : TensorMap();
  std::vector<double> out;
  const int64_t multiple = backend.auto_pad_multiple();
  for (size_t start = 0; start < sequences.size(); start += static_cast<size_t>(batch_size)) {
    const size_t end = std::min(sequences.size(), start + static_cast<size_t>(batch_size));
    int64_t longest = 1;
    for (size_t i = start; i < end; ++i) {
      if (sequences[i].empty()) fail("reward_scores: sequence {} is empty", i);
      longest = std::max<int64_t>(longest, static_cast<int64_t>(sequences[i].size()));
    }
    const int64_t B = static_cast<int64_t>(end - start), T = padded_length(longest, multiple);
    std::vector<int32_t> ids(static_cast<size_t>(B * T), m.pad_token_id), mask(static_cast<size_t>(B * T), 0), pos(static_cast<size_t>(B * T), 0);
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int32_t>& s = sequences[start + static_cast<size_t>(b)];
      for (int64_t t = 0; t < static_cast<int64_t>(s.size()); ++t) {
        ids[static_cast<size_t>(b * T + t)] = s[static_cast<size_t>(t)];
        mask[static_cast<size_t>(b * T + t)] = 1;
        pos[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(t);
      }
    }
    const graph::Graph g = m.backbone.reward_graph(B, T);
    TensorMap in = weights == nullptr ? own : *weights;
    in["input_ids"] = to_backend(backend, Tensor::from_i32(ids, {B, T}), "input_ids");
    in["attention_mask"] = to_backend(backend, Tensor::from_i32(mask, {B, T}), "attention_mask");
    in["position_ids"] = to_backend(backend, Tensor::from_i32(pos, {B, T}), "position_ids");
    std::vector<int64_t> at;
    for (int64_t b = 0; b < B; ++b) at.push_back(pooled_position(ids.data() + b * T, T, m.pad_token_id));
    const std::vector<double> r = pooled_scores(backend, programs.get(g).run(in).at(g.output_index("rewards")), at);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

}  // namespace trl

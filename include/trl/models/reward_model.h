// Reward models: Transformers' AutoModelForSequenceClassification with one label for Qwen3 / Qwen2 / Llama, the
// decoder plus a `score` head (hidden → 1, no bias) read at the rightmost token that is not the pad token (as
// Transformers pools). Loads a causal-LM checkpoint (a new head, drawn as Transformers initialises a Linear:
// N(0, initializer_range)) or a sequence-classification checkpoint (`architectures:
// [Qwen3ForSequenceClassification]`, `score.weight`, `pad_token_id`), and saves the latter.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trl/backend/backend.h"
#include "trl/backend/program_cache.h"
#include "trl/models/causal_lm.h"

namespace trl {

struct RewardModel {
  CausalLM backbone;       // the decoder; its lm_head is never used
  Tensor score;            // score.weight [1, hidden], in the backbone's dtype
  int32_t pad_token_id = 0;
  bool new_head = false;   // true: drawn here (a causal-LM checkpoint), not loaded
};

// Whether `dir`'s config.json names a ForSequenceClassification architecture.
bool is_sequence_classification_config(const std::string& dir);
// Whether `dir` is a PEFT adapter of task_type SEQ_CLS (what `trl reward --use_peft` saves: the adapter and the
// score head). load_reward_model reads it as its base with the adapter merged and that head.
bool is_sequence_classification_adapter(const std::string& dir);

// A reward model from a model folder or id (local cache). A sequence-classification checkpoint must have one
// label (score.weight [1, hidden]; a checkpoint with num_labels 2 is an error naming the file and the field) and its
// pad_token_id (else `pad_token_id`); a causal-LM checkpoint gets a new head from `seed`, and `pad_token_id` is
// required for it.
RewardModel load_reward_model(const std::string& name_or_path, const LoadOptions& options = {}, std::optional<int32_t> pad_token_id = std::nullopt,
                              uint64_t seed = 42);

// The reward model of a SEQ_CLS adapter folder on `adapted` (its base with that adapter attached, e.g. a base other
// than the adapter's base_model_name_or_path): the adapter merged, and the score head the adapter saved.
RewardModel reward_model_from_adapter(const CausalLM& adapted, const std::string& adapter_dir, std::optional<int32_t> pad_token_id = std::nullopt);

// A new head on an existing decoder (weights N(0, initializer_range), in the decoder's dtype).
Tensor new_score_head(const ModelConfig& config, DType dtype, uint64_t seed);

// The sequence-classification folder: config.json (architectures <Type>ForSequenceClassification, id2label with one
// label, pad_token_id, torch_dtype) and the weights of `weights` (the decoder's and score.weight; no lm_head).
void save_reward_model(const std::string& dir, const ModelConfig& config, const TensorMap& weights, int32_t pad_token_id, DType dtype);

// Where a row is pooled: the rightmost position whose id is not pad_token_id (0 when every id is the pad).
int64_t pooled_position(const int32_t* ids, int64_t length, int32_t pad_token_id);

// Each row's score at its pooled position (f32 `scores` [R, T] in `backend`'s memory), read where the scores are
// (one-token spans of Backend::span_sums, exact in f64): the [R] rewards come down, not the [R, T] scores.
std::vector<double> pooled_scores(Backend& backend, const Tensor& scores, const std::vector<int64_t>& positions);

// The tensors a reward program binds (the decoder's but lm_head, and score.weight) in `backend`'s memory: uploaded to
// a device backend, as they are on the host. A caller that scores often makes them once.
TensorMap reward_weights(const RewardModel& model, Backend& backend);

// The reward of each sequence, in batches of `batch_size` rows padded to the backend's bucket (forward only).
std::vector<double> reward_scores(const RewardModel& model, const std::vector<std::vector<int32_t>>& sequences, Backend& backend, int64_t batch_size = 8);
// The same with the caller's programs (kept across calls: GRPO scores every generation round with one program
// per bucket) and, when given, the reward_weights made for their backend.
std::vector<double> reward_scores(const RewardModel& model, const std::vector<std::vector<int32_t>>& sequences, ProgramCache& programs,
                                  int64_t batch_size = 8, const TensorMap* weights = nullptr);

}  // namespace trl

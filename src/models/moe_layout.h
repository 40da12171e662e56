// Qwen3-MoE's experts on disk and in memory. Checkpoints on the Hub keep one tensor per expert
// (model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight); the model holds each layer's experts stacked, as
// Transformers v5 does in memory: mlp.experts.gate_up_proj [E, 2F, C] (gate rows first) and mlp.experts.down_proj
// [E, C, F]. Loading stacks them (or takes v5's stacked tensors when a checkpoint has those); saving writes the
// per-expert tensors back, as save_pretrained does by default.
#pragma once

#include <optional>
#include <set>
#include <string>

#include "trl/core/tensor.h"
#include "trl/io/model_config.h"
#include "trl/io/safetensors.h"

namespace trl {

// The stacked expert tensors of every sparse layer, read from `ck` (folder `dir`, for errors) into `weights` and
// converted to `dtype` when given; the checkpoint names they came from are added to `used`.
void load_stacked_experts(const ModelConfig& config, const Checkpoint& ck, const std::string& dir, std::optional<DType> dtype, TensorMap& weights,
                          std::set<std::string>& used);

// `weights` as a checkpoint holds them: each stacked expert tensor as its per-expert slices (views, no copy).
TensorMap checkpoint_tensors(const ModelConfig& config, const TensorMap& weights);

}  // namespace trl

// LoRA adapters in PEFT's format (docs/LORA.md): the configuration adapter_config.json holds, which linear modules
// of a model it adapts, a fresh adapter's initialisation, reading and writing an adapter folder
// (adapter_config.json + adapter_model.safetensors) and merging an adapter into its base weights.
//
// An adapted nn.Linear computes y = x·Wᵀ (+ b) + scaling · (dropout(x)·Aᵀ)·Bᵀ with A [r, in], B [out, r] and
// scaling = lora_alpha / r (lora_alpha / √r with use_rslora). Inside trl an adapter's tensors are named after their
// module: "<module>.lora_A.weight", "<module>.lora_B.weight" (module = "model.layers.0.self_attn.q_proj"); the
// file prefixes them with "base_model.model." as PEFT does. modules_to_save are trained in full and saved by their
// parameter names ("lm_head.weight" → "base_model.model.lm_head.weight").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/core/tensor.h"
#include "trl/io/model_config.h"
#include "trl/io/safetensors.h"

namespace trl {

// PEFT's LoraConfig: the fields trl reads and writes (others in a file are ignored unless they change the math,
// which is an error: use_dora, rank_pattern, alpha_pattern, layers_to_transform, fan_in_fan_out, bias).
struct LoraConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0;
  // Short module names ("q_proj") matched against the end of each module's name, or the single name "all-linear"
  // (every linear layer but the output head); empty: the model type's default (q_proj and v_proj, as PEFT).
  std::vector<std::string> target_modules;
  // A target_modules string other than "all-linear" in a file: a regular expression matched against whole module names.
  std::string target_regex;
  // PEFT's target_parameters: parameter names matched against the end of each parameter's name. A mixture of
  // experts' stacked experts ("mlp.experts.gate_up_proj" [E, 2F, C], "mlp.experts.down_proj" [E, C, F]) take one
  // adapter per expert, ΔW_e = scaling·B_e·A_e; a 2-D weight ("mlp.gate.weight", the router) takes a plain one. With
  // target_parameters set and target_modules empty, no module is targeted (no q_proj/v_proj default), as in PEFT.
  // PEFT's LoRA on parameters has no dropout: lora_dropout must be 0.
  std::vector<std::string> target_parameters;
  bool use_rslora = false;
  std::vector<std::string> modules_to_save;  // modules trained in full beside the adapters ("lm_head", "score")
  std::string task_type = "CAUSAL_LM";       // SEQ_CLS for a reward model
  std::string base_model_name_or_path;

  double scaling() const;
  // adapter_config.json as PEFT writes it (sorted keys, peft_type LORA, inference_mode true).
  nlohmann::ordered_json to_json() const;
  // From adapter_config.json; `source` names the file in errors.
  static LoraConfig from_json(const nlohmann::json& j, const std::string& source);
};

// An adapter for one model: its config, the adapted modules in model order, and its tensors by trl name (lora_A and
// lora_B of each module, then the modules_to_save weights). A module is a linear layer ("model.layers.0.mlp.gate")
// or a stacked experts parameter ("model.layers.0.mlp.experts.gate_up_proj"; see lora_shapes).
struct LoraAdapter {
  LoraConfig config;
  std::vector<std::string> modules;
  TensorMap weights;
};

// The linear modules of a model with `config` (model order) that `lora` adapts. An error names a target that matches
// no linear module, or one that cannot be adapted (the embeddings and the output head: train them in full with
// modules_to_save).
std::vector<std::string> lora_target_modules(const ModelConfig& config, const LoraConfig& lora);
// The parameters that modules_to_save trains in full: those named "<module>.weight" / "<module>.bias" for a module
// in the list (matched against the end of the name) among `parameter_names` (the model's, and a head such as
// "score.weight"). An error names a module that matches no parameter.
std::vector<std::string> lora_saved_parameters(const LoraConfig& lora, const std::vector<std::string>& parameter_names);
// A fresh adapter as PEFT initialises one (init_lora_weights=True): A ~ U(−1/√in, 1/√in) (kaiming_uniform with
// a = √5), B = 0, so the adapted model starts as the base model; f32; drawn from `seed`. modules_to_save are not
// included (they start as the base's weights).
LoraAdapter init_lora(const ModelConfig& config, const LoraConfig& lora, uint64_t seed);
// The shape of a module's weight [out, in] in a model with `config`.
Shape lora_module_shape(const ModelConfig& config, const std::string& module);
// The shapes of a module's lora_A and lora_B at rank r. A linear module with weight [out, in]: A [r, in], B [out, r].
// Stacked experts [E, out, in]: A [E·r, in] (PEFT's: rows e·r + j), B [E, out, r] (trl's; PEFT's file holds
// [out, r·E] with column j·E + e, which save_adapter and load_adapter permute); experts = E (0 for a linear module).
struct LoraShapes {
  Shape a, b;
  int64_t experts = 0;
};
LoraShapes lora_shapes(const ModelConfig& config, const std::string& module, int64_t r);

// Whether `dir` holds an adapter (adapter_config.json).
bool is_adapter_dir(const std::string& dir);
// An adapter folder's adapter_config.json, read and checked (errors name the file).
LoraConfig read_adapter_config(const std::string& dir);
// The base model an adapter folder names in base_model_name_or_path: a folder (taken from where the command runs,
// then from beside the adapter) or a hub id as written. An error says how to give the base when it is not set.
std::string adapter_base_model(const std::string& dir);
// Reads a PEFT LoRA adapter folder for a model with `config`: every module the config targets needs its lora_A
// [r, in] and lora_B [out, r]; tensors named with PEFT's ".default" adapter name are accepted.
LoraAdapter load_adapter(const std::string& dir, const ModelConfig& config);
// Writes adapter_config.json and adapter_model.safetensors (metadata {"format": "pt"}) into `dir`, the lora tensors
// as they are given (f32 masters, as PEFT keeps adapters) and the modules_to_save weights likewise.
void save_adapter(const std::string& dir, const LoraConfig& config, const TensorMap& weights);

// The base weights with every adapted module merged, W + scaling·B·A (computed in f32, stored in W's dtype), and
// the modules_to_save weights in place of the base's (in the base's dtype).
TensorMap merge_lora(const TensorMap& base, const LoraAdapter& adapter);

}  // namespace trl

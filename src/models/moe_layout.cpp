#include "models/moe_layout.h"

#include <cstring>

#include <fmt/format.h>

#include "trl/core/error.h"

namespace trl {

namespace {

std::string expert_name(int64_t layer, int64_t e, const char* proj) { return fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, e, proj); }

// One per-expert tensor, checked against its shape and converted to `dt`.
Tensor expert_part(const Checkpoint& ck, const std::string& dir, const std::string& name, const Shape& shape, DType dt) {
  if (!ck.contains(name))
    fail("{}: tensor '{}' is missing (a qwen3_moe checkpoint holds gate_proj, up_proj and down_proj for every expert, or Transformers v5's "
         "stacked mlp.experts.gate_up_proj and mlp.experts.down_proj)",
         dir, name);
  Tensor t = ck.get(name);
  if (!dtype_is_float(t.dtype())) fail("{}: tensor '{}' has dtype {}; weights must be floating point", dir, name, dtype_name(t.dtype()));
  if (t.shape() != shape) fail("{}: tensor '{}' has shape {}, expected {} for this config.json", dir, name, shape_str(t.shape()), shape_str(shape));
  return t.dtype() == dt ? t : t.to(dt);
}

}  // namespace

void load_stacked_experts(const ModelConfig& c, const Checkpoint& ck, const std::string& dir, std::optional<DType> dtype, TensorMap& weights,
                          std::set<std::string>& used) {
  const int64_t E = c.moe.num_experts, F = c.moe.moe_intermediate_size, C = c.hidden_size;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.sparse_layer(i)) continue;
    const std::string l = fmt::format("model.layers.{}.mlp.experts.", i);
    if (ck.contains(l + "gate_up_proj") && ck.contains(l + "down_proj")) {  // Transformers v5, save_original_format=False
      for (const char* name : {"gate_up_proj", "down_proj"}) {
        Tensor t = ck.get(l + name);
        if (!dtype_is_float(t.dtype())) fail("{}: tensor '{}{}' has dtype {}; weights must be floating point", dir, l, name, dtype_name(t.dtype()));
        weights.emplace(l + name, dtype && t.dtype() != *dtype ? t.to(*dtype) : t);
        used.insert(l + name);
      }
      continue;
    }
    // The stacked tensors take the dtype of expert 0's gate_proj (or the one asked for).
    const std::string first = expert_name(i, 0, "gate_proj");
    const DType dt = dtype ? *dtype : ck.contains(first) && dtype_is_float(ck.get(first).dtype()) ? ck.get(first).dtype() : DType::F32;
    Tensor gate_up = Tensor::zeros(dt, {E, 2 * F, C}), down = Tensor::zeros(dt, {E, C, F});
    const size_t part = static_cast<size_t>(F * C) * dtype_size(dt);
    for (int64_t e = 0; e < E; ++e) {
      char* gu = static_cast<char*>(gate_up.mutable_data()) + static_cast<size_t>(e) * 2 * part;
      std::memcpy(gu, expert_part(ck, dir, expert_name(i, e, "gate_proj"), {F, C}, dt).data(), part);
      std::memcpy(gu + part, expert_part(ck, dir, expert_name(i, e, "up_proj"), {F, C}, dt).data(), part);
      std::memcpy(static_cast<char*>(down.mutable_data()) + static_cast<size_t>(e) * part, expert_part(ck, dir, expert_name(i, e, "down_proj"), {C, F}, dt).data(),
                  part);
      for (const char* p : {"gate_proj", "up_proj", "down_proj"}) used.insert(expert_name(i, e, p));
    }
    weights.emplace(l + "gate_up_proj", std::move(gate_up));
    weights.emplace(l + "down_proj", std::move(down));
  }
}

TensorMap checkpoint_tensors(const ModelConfig& c, const TensorMap& weights) {
  if (c.moe.num_experts == 0) return weights;
  TensorMap out;
  const int64_t F = c.moe.moe_intermediate_size, C = c.hidden_size;
  for (const auto& [name, t] : weights) {
    const bool gate_up = name.ends_with(".mlp.experts.gate_up_proj"), down = name.ends_with(".mlp.experts.down_proj");
    if (!gate_up && !down) {
      out.emplace(name, t);
      continue;
    }
    const std::string prefix = name.substr(0, name.size() - (gate_up ? std::string("gate_up_proj") : std::string("down_proj")).size());
    for (int64_t e = 0; e < t.size(0); ++e) {
      if (gate_up) {
        out.emplace(fmt::format("{}{}.gate_proj.weight", prefix, e), t.slice_flat(e * 2 * F * C, {F, C}));
        out.emplace(fmt::format("{}{}.up_proj.weight", prefix, e), t.slice_flat(e * 2 * F * C + F * C, {F, C}));
      } else {
        out.emplace(fmt::format("{}{}.down_proj.weight", prefix, e), t.slice_flat(e * C * F, {C, F}));
      }
    }
  }
  return out;
}

}  // namespace trl

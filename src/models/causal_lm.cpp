#include "trl/models/causal_lm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <filesystem>

#include "trl/core/error.h"
#include "core/fs.h"
#include "graph/autodiff.h"
#include "graph/passes.h"
#include "models/moe_layout.h"
#include "trl/io/hub.h"
#include "trl/backend/registry.h"
#include "trl/runtime/runtime.h"

namespace trl {

namespace fs = std::filesystem;
using graph::Builder;
using graph::kNone;
using graph::ValueId;

std::vector<std::pair<std::string, Shape>> parameter_shapes(const ModelConfig& c) {
  const int64_t C = c.hidden_size, F = c.intermediate_size, D = c.head_dim, V = c.vocab_size;
  std::vector<std::pair<std::string, Shape>> p;
  p.emplace_back("model.embed_tokens.weight", Shape{V, C});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    p.emplace_back(l + "input_layernorm.weight", Shape{C});
    p.emplace_back(l + "self_attn.q_proj.weight", Shape{c.q_dim(), C});
    if (c.qkv_bias) p.emplace_back(l + "self_attn.q_proj.bias", Shape{c.q_dim()});
    p.emplace_back(l + "self_attn.k_proj.weight", Shape{c.kv_dim(), C});
    if (c.qkv_bias) p.emplace_back(l + "self_attn.k_proj.bias", Shape{c.kv_dim()});
    p.emplace_back(l + "self_attn.v_proj.weight", Shape{c.kv_dim(), C});
    if (c.qkv_bias) p.emplace_back(l + "self_attn.v_proj.bias", Shape{c.kv_dim()});
    p.emplace_back(l + "self_attn.o_proj.weight", Shape{C, c.q_dim()});
    if (c.o_bias) p.emplace_back(l + "self_attn.o_proj.bias", Shape{C});
    if (c.qk_norm) {
      p.emplace_back(l + "self_attn.q_norm.weight", Shape{D});
      p.emplace_back(l + "self_attn.k_norm.weight", Shape{D});
    }
    p.emplace_back(l + "post_attention_layernorm.weight", Shape{C});
    if (c.sparse_layer(i)) {  // the router and the experts' stacked weights (checkpoints keep one tensor per expert: moe.h)
      const int64_t E = c.moe.num_experts, Fm = c.moe.moe_intermediate_size;
      p.emplace_back(l + "mlp.gate.weight", Shape{E, C});
      p.emplace_back(l + "mlp.experts.gate_up_proj", Shape{E, 2 * Fm, C});
      p.emplace_back(l + "mlp.experts.down_proj", Shape{E, C, Fm});
      continue;
    }
    p.emplace_back(l + "mlp.gate_proj.weight", Shape{F, C});
    if (c.mlp_bias) p.emplace_back(l + "mlp.gate_proj.bias", Shape{F});
    p.emplace_back(l + "mlp.up_proj.weight", Shape{F, C});
    if (c.mlp_bias) p.emplace_back(l + "mlp.up_proj.bias", Shape{F});
    p.emplace_back(l + "mlp.down_proj.weight", Shape{C, F});
    if (c.mlp_bias) p.emplace_back(l + "mlp.down_proj.bias", Shape{C});
  }
  p.emplace_back("model.norm.weight", Shape{C});
  if (!c.tie_word_embeddings) p.emplace_back("lm_head.weight", Shape{V, C});
  return p;
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) {
    // Transformers: 1 / base ** (arange(0, D, 2).float() / D), all in f32.
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(c.head_dim);
    const float power = static_cast<float>(std::pow(static_cast<double>(static_cast<float>(c.rope_theta)), static_cast<double>(exponent)));
    inv[static_cast<size_t>(j)] = 1.0f / power;
  }
  if (c.rope_scaling.rope_type == "llama3") {
    const RopeScaling& r = c.rope_scaling;
    const double old_len = static_cast<double>(r.original_max_position_embeddings);
    const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2.0 * M_PI / f;
      double scaled = wavelen > low_wavelen ? f / r.factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        scaled = (1 - smooth) * scaled / r.factor + smooth * scaled;
      }
      f = static_cast<float>(scaled);
    }
  }
  return inv;
}

Tensor default_position_ids(const Tensor& mask) {
  if (mask.dtype() != DType::I32 || mask.dim() != 2) fail("attention_mask must be i32 [B,T], got {} {}", dtype_name(mask.dtype()), shape_str(mask.shape()));
  const int64_t B = mask.size(0), T = mask.size(1);
  Tensor pos = Tensor::zeros(DType::I32, {B, T});
  const int32_t* m = mask.data_as<int32_t>();
  int32_t* p = pos.mutable_data_as<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    int32_t seen = 0, segment = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = m[b * T + t];
      if (s != 0 && s != segment) seen = 0, segment = s;  // a new packed sequence starts at position 0
      seen += s != 0;
      p[b * T + t] = s != 0 ? seen - 1 : 1;
    }
  }
  return pos;
}

CausalLM CausalLM::from_weights(ModelConfig config, TensorMap weights, const std::string& source) {
  CausalLM m;
  m.config_ = std::move(config);
  const auto expected = parameter_shapes(m.config_);
  std::optional<DType> dtype;
  for (const auto& [name, shape] : expected) {
    auto it = weights.find(name);
    if (it == weights.end()) {
      fail("{}: missing tensor '{}' (expected shape {} for this {} config)", source, name, shape_str(shape), m.config_.model_type);
    }
    if (it->second.shape() != shape) {
      fail("{}: tensor '{}' has shape {}, but the config implies {}", source, name, shape_str(it->second.shape()), shape_str(shape));
    }
    if (!dtype_is_float(it->second.dtype())) fail("{}: tensor '{}' has dtype {}; weights must be floating point", source, name, dtype_name(it->second.dtype()));
    if (!dtype) dtype = it->second.dtype();
    if (*dtype != it->second.dtype()) {
      fail("{}: tensor '{}' is {} but the other weights are {}; convert with a --dtype option", source, name,
           dtype_name(it->second.dtype()), dtype_name(*dtype));
    }
    m.weights_.emplace(name, it->second);
  }
  m.dtype_ = dtype.value_or(DType::F32);
  return m;
}

int tensor_parallel_axis(const std::string& name) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::char_traits<char>::length(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  for (const char* rows : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".gate_proj.weight", ".up_proj.weight", ".q_proj.bias",
                           ".k_proj.bias", ".v_proj.bias"})
    if (ends_with(rows)) return 0;
  for (const char* cols : {".o_proj.weight", ".down_proj.weight"})
    if (ends_with(cols)) return 1;
  // A mixture of experts' stacked experts: whole experts per rank (expert parallel); the router stays whole.
  if (ends_with(".mlp.experts.gate_up_proj") || ends_with(".mlp.experts.down_proj")) return 0;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return 0;  // vocabulary parallel
  return -1;
}

Tensor tensor_parallel_slice(const std::string& name, const Tensor& whole, const TensorParallel& tp) {
  const int axis = tensor_parallel_axis(name);
  if (axis < 0 || tp.size == 1) return whole;
  const int64_t n = whole.size(axis);
  if (n % tp.size != 0) fail("tensor parallel: {} {} does not split into {} equal parts along axis {}", name, shape_str(whole.shape()), tp.size, axis);
  const int64_t part = n / tp.size;
  if (axis == 0) {
    const int64_t row = whole.numel() / n;
    Shape s = whole.shape();
    s[0] = part;
    return whole.slice_flat(tp.rank * part * row, s).clone();
  }
  // Columns of a [R, K] matrix: each row's run of K / size elements.
  const int64_t R = whole.size(0), K = whole.size(1);
  Tensor out = Tensor::uninitialized(whole.dtype(), {R, part});
  const size_t es = dtype_size(whole.dtype());
  const char* src = static_cast<const char*>(whole.data());
  char* dst = static_cast<char*>(out.mutable_data());
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(dst + static_cast<size_t>(r * part) * es, src + static_cast<size_t>(r * K + tp.rank * part) * es, static_cast<size_t>(part) * es);
  return out;
}

CausalLM CausalLM::tensor_parallel_shard(const TensorParallel& tp) const {
  if (tp_.size != 1) fail("tensor_parallel_shard: this model is already rank {} of {}", tp_.rank, tp_.size);
  if (lora_)
    fail("tp_size (or ep_size) {}: LoRA adapters are not supported under tensor or expert parallel; train the adapter with data parallel or FSDP",
         tp.size);
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size) fail("tensor_parallel_shard: rank {} of {} does not exist", tp.rank, tp.size);
  const ModelConfig& c = config_;
  bool dense = false, sparse = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) (c.sparse_layer(i) ? sparse : dense) = true;
  std::vector<std::pair<const char*, int64_t>> parts = {
      {"num_attention_heads", c.num_attention_heads}, {"num_key_value_heads", c.num_key_value_heads}, {"vocab_size", c.vocab_size}};
  if (dense) parts.push_back({"intermediate_size", c.intermediate_size});
  if (sparse) parts.push_back({"num_experts", c.moe.num_experts});
  for (const auto& [what, n] : parts)
    if (n % tp.size != 0)
      fail("tp_size (or ep_size) {}: the model's {} ({}) does not divide by it (each rank takes whole heads, whole experts and equal parts of the MLP and "
           "the vocabulary); choose a size that divides num_attention_heads, num_key_value_heads, vocab_size{}",
           tp.size, what, n, sparse ? ", num_experts" : ", intermediate_size");
  CausalLM m = *this;
  for (auto& [name, w] : m.weights_) w = tensor_parallel_slice(name, w, tp);
  m.tp_ = tp;
  return m;
}

CausalLM CausalLM::with_weights(TensorMap weights, const std::string& source) const {
  CausalLM m = *this;
  std::optional<DType> dtype;
  for (auto& [name, w] : m.weights_) {
    const auto it = weights.find(name);
    if (it == weights.end()) fail("{}: missing tensor '{}' (expected shape {})", source, name, shape_str(w.shape()));
    if (it->second.shape() != w.shape())
      fail("{}: tensor '{}' has shape {}, the model's is {}", source, name, shape_str(it->second.shape()), shape_str(w.shape()));
    if (dtype && *dtype != it->second.dtype())
      fail("{}: tensor '{}' is {} but the other weights are {}", source, name, dtype_name(it->second.dtype()), dtype_name(*dtype));
    dtype = it->second.dtype();
    w = it->second;
  }
  if (dtype) m.dtype_ = *dtype;
  return m;
}

CausalLM CausalLM::with_adapter(const LoraAdapter& adapter) const {
  if (lora_) fail("with_adapter: the model already has a LoRA adapter (one adapter at a time)");
  if (tp_.size > 1)
    fail("LoRA adapters are not supported under tensor or expert parallel (tp_size or ep_size {}); use data parallel or FSDP", tp_.size);
  CausalLM m = *this;
  auto spec = std::make_shared<LoraAdapter>();
  spec->config = adapter.config;
  spec->modules = adapter.modules;
  (void)adapter.config.scaling();  // checks r
  for (const std::string& module : adapter.modules) {
    const LoraShapes s = lora_shapes(config_, module, adapter.config.r);
    for (const auto& [part, shape] : {std::pair<std::string, Shape>{".lora_A.weight", s.a}, {".lora_B.weight", s.b}}) {
      const auto it = adapter.weights.find(module + part);
      if (it == adapter.weights.end()) fail("with_adapter: the adapter has no '{}{}'", module, part);
      if (it->second.shape() != shape)
        fail("with_adapter: '{}{}' is {}, r = {} and the model imply {}", module, part, shape_str(it->second.shape()), adapter.config.r, shape_str(shape));
      m.weights_[module + part] = it->second.dtype() == dtype_ ? it->second : it->second.to(dtype_);
    }
  }
  // modules_to_save: the adapter's copy where it has one (a saved adapter), else the base weight stays.
  std::vector<std::string> params;
  for (const auto& [name, shape] : parameter_shapes(config_)) params.push_back(name);
  if (!adapter.config.modules_to_save.empty()) {
    params.push_back("score.weight");  // a reward model's head (the reward trainer holds it)
    for (const std::string& p : lora_saved_parameters(adapter.config, params)) {
      const auto it = adapter.weights.find(p);
      if (it == adapter.weights.end() || !m.weights_.count(p)) continue;
      if (it->second.shape() != m.weights_.at(p).shape())
        fail("with_adapter: the saved module '{}' is {}, the model's is {}", p, shape_str(it->second.shape()), shape_str(m.weights_.at(p).shape()));
      m.weights_[p] = it->second.dtype() == dtype_ ? it->second : it->second.to(dtype_);
    }
  }
  m.lora_ = std::move(spec);
  return m;
}

CausalLM CausalLM::without_adapter() const {
  CausalLM m = *this;
  if (!lora_) return m;
  for (const std::string& module : lora_->modules) m.weights_.erase(module + ".lora_A.weight"), m.weights_.erase(module + ".lora_B.weight");
  m.lora_.reset();
  return m;
}

CausalLM CausalLM::merged() const {
  if (!lora_) return *this;
  LoraAdapter a{lora_->config, lora_->modules, {}};
  for (const std::string& module : lora_->modules)
    for (const char* part : {".lora_A.weight", ".lora_B.weight"}) a.weights[module + part] = weights_.at(module + part);
  CausalLM m = without_adapter();
  m.weights_ = merge_lora(m.weights_, a);
  return m;
}

const std::vector<std::string>& CausalLM::lora_modules() const {
  static const std::vector<std::string> none;
  return lora_ ? lora_->modules : none;
}

std::vector<std::string> CausalLM::lora_parameters() const {
  std::vector<std::string> out;
  if (!lora_) return out;
  for (const std::string& module : lora_->modules) out.push_back(module + ".lora_A.weight"), out.push_back(module + ".lora_B.weight");
  std::vector<std::string> params;
  for (const auto& [name, shape] : parameter_shapes(config_)) params.push_back(name);
  params.push_back("score.weight");
  if (!lora_->config.modules_to_save.empty())
    for (const std::string& p : lora_saved_parameters(lora_->config, params)) out.push_back(p);
  return out;
}

std::vector<std::string> CausalLM::trainable_parameters() const {
  if (lora_) return lora_parameters();
  std::vector<std::string> out;
  for (const auto& [name, shape] : parameter_shapes(config_)) out.push_back(name);
  return out;
}

CausalLM CausalLM::from_pretrained(const std::string& name_or_path, const LoadOptions& options) {
  // A PEFT adapter folder (adapter_config.json, no config.json): its base model, found through
  // base_model_name_or_path (a folder or a hub id in the local cache), with the adapter attached.
  if (fs::is_directory(name_or_path) && is_adapter_dir(name_or_path) && !fs::is_regular_file(fs::path(name_or_path) / "config.json")) {
    const std::string base = adapter_base_model(name_or_path);
    const CausalLM m = [&] {
      try {
        return from_pretrained(base, options);
      } catch (const Error& e) {
        fail("{}: the adapter's base model '{}' (base_model_name_or_path in adapter_config.json) did not load: {}", name_or_path, base, e.what());
      }
    }();
    return m.with_adapter(load_adapter(name_or_path, m.config()));
  }
  const std::string device = resolve_device(options.device);
  const std::string dir = resolve_model_dir(name_or_path, options.revision);
  ModelConfig config = ModelConfig::load((fs::path(dir) / "config.json").string());
  Checkpoint ck = Checkpoint::open(dir);
  TensorMap weights;
  std::set<std::string> used;  // checkpoint tensors read (the per-expert ones of a mixture of experts included)
  if (config.moe.num_experts > 0) load_stacked_experts(config, ck, dir, options.dtype, weights, used);
  for (const auto& [name, shape] : parameter_shapes(config)) {
    if (weights.count(name) || !ck.contains(name)) continue;  // a missing one is reported by from_weights with the expected shape
    used.insert(name);
    Tensor t = ck.get(name);
    // Before any conversion: an integer or boolean tensor cannot be a weight, whatever --dtype asks for.
    if (!dtype_is_float(t.dtype())) fail("{}: tensor '{}' has dtype {}; weights must be floating point", dir, name, dtype_name(t.dtype()));
    if (options.dtype && t.dtype() != *options.dtype) t = t.to(*options.dtype);
    weights.emplace(name, std::move(t));
  }
  // Checkpoints of models with mixed dtypes (an f32 norm in a bf16 model, say) are converted to the majority dtype.
  if (!options.dtype) {
    std::map<DType, int> count;
    for (const auto& [name, t] : weights) count[t.dtype()]++;
    if (count.size() > 1) {
      DType major = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
      for (auto& [name, t] : weights) {
        if (t.dtype() != major) t = t.to(major);
      }
    }
  }
  // A sequence-classification checkpoint (a reward model) has no lm_head: an untied config gets the embeddings in
  // its place, which the reward programs never read (trl/models/reward_model.h).
  bool classifier = false;
  for (const std::string& a : config.architectures) classifier = classifier || a.ends_with("ForSequenceClassification");
  if (classifier && !config.tie_word_embeddings && !weights.count("lm_head.weight") && weights.count("model.embed_tokens.weight"))
    weights.emplace("lm_head.weight", weights.at("model.embed_tokens.weight"));
  // Tensors the architecture has no place for: reported, not loaded (Transformers warns the same way). A tied
  // model's lm_head.weight and old rotary buffers are expected extras.
  std::set<std::string> known;
  for (const auto& [name, shape] : parameter_shapes(config)) known.insert(name);
  std::vector<std::string> unused;
  for (const std::string& name : ck.names()) {
    const bool extra_ok = (name == "lm_head.weight" && config.tie_word_embeddings) || name.ends_with("rotary_emb.inv_freq") ||
                          (name == "score.weight" && classifier);  // a reward model's head: load_reward_model reads it
    if (!known.count(name) && !used.count(name) && !extra_ok) unused.push_back(name);
  }
  CausalLM m = from_weights(std::move(config), std::move(weights), dir);
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 8; ++i) list += (i ? ", " : "") + unused[i];
    if (unused.size() > 8) list += fmt::format(", ... ({} in all)", unused.size());
    std::fprintf(stderr, "[trl] warning: %s: %zu checkpoint tensor(s) not used by this %s config (check config.json matches the weights): %s\n",
                 dir.c_str(), unused.size(), m.config_.model_type.c_str(), list.c_str());
  }
  m.unused_weights_ = std::move(unused);
  m.path_ = dir;
  m.device_ = device;
  return m;
}

int64_t CausalLM::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : weights_) n += t.numel();
  return n;
}

ValueId CausalLM::build_forward(Builder& b, int64_t B, int64_t T) const {
  ValueId head = kNone;
  const ValueId h = build_hidden(b, B, T, &head);
  return b.matmul(h, head, kNone, dtype_, "lm_head");
}

namespace {

// The decoder's building blocks, after llama.cpp's model builders (build_norm / build_attn / build_ffn): the
// mainline in CausalLM::build_hidden is a short loop over them. Every projection goes through linear(), the one
// place a LoRA adapter attaches to (it sees the module name, e.g. "model.layers.3.self_attn.q_proj").
class DecoderBuilder {
 public:
  struct Inputs {
    ValueId positions = kNone, mask = kNone, cache_position = kNone, query_positions = kNone, cache_rows = kNone;
  };

  DecoderBuilder(Builder& b, const ModelConfig& c, const TensorMap& weights, DType dt, const TensorParallel& tp, const LoraAdapter* lora,
                 bool training)
      : b_(b), c_(c), weights_(weights), dt_(dt), tp_(tp), lora_(lora), training_(training) {}

  ValueId weight(const std::string& name) {
    const Tensor& t = weights_.at(name);
    return b_.input(name, t.shape(), t.dtype());
  }
  ValueId optional_weight(const std::string& name) { return weights_.count(name) ? weight(name) : kNone; }

  // y = x·Wᵀ (+ b) for the nn.Linear `module` ("<module>.weight", optional "<module>.bias"); with a LoRA adapter on
  // the module, + scaling·(dropout(x)·Aᵀ)·Bᵀ (A [r, in], B [out, r]; dropout only in training graphs). The scale is
  // applied to the [.., r] product, the smallest tensor of the branch.
  ValueId linear(ValueId x, const std::string& module, const std::string& tag) {
    const ValueId y = b_.matmul(x, weight(module + ".weight"), optional_weight(module + ".bias"), dt_, tag);
    if (!lora_) return y;
    const auto at = std::find(lora_->modules.begin(), lora_->modules.end(), module);
    if (at == lora_->modules.end()) return y;
    const double p = lora_->config.lora_dropout;
    ValueId xa = x;
    if (training_ && p > 0) {
      if (dropout_seed_ == kNone) dropout_seed_ = b_.input("lora_dropout_seed", {2}, DType::I32);
      xa = b_.dropout(x, dropout_seed_, p, at - lora_->modules.begin(), tag + ".lora_dropout");
    }
    ValueId a = b_.matmul(xa, weight(module + ".lora_A.weight"), kNone, dt_, tag + ".lora_A");
    a = b_.scale_by(a, b_.fill({}, DType::F32, lora_->config.scaling(), tag + ".lora_scaling"), dt_, tag + ".lora_scaled");
    // B's GEMM accumulates into the base output (in place: no [.., out] add or second buffer).
    return b_.matmul(a, weight(module + ".lora_B.weight"), kNone, dt_, tag + ".lora_B", /*addend=*/y);
  }
  // A stacked experts parameter [E, out, in] ("<layer>.mlp.experts.gate_up_proj"); with a LoRA adapter on it (PEFT's
  // target_parameters), W + scaling·ΔW with ΔW_e = B_e·A_e (A [E·r, in] viewed as [E, r, in], B [E, out, r]): the
  // experts run on the merged weight, as PEFT's ParamWrapper does, and the experts' weight gradient flows into A, B.
  ValueId expert_weight(const std::string& name, const std::string& tag) {
    const ValueId w = weight(name);
    if (!lora_ || std::find(lora_->modules.begin(), lora_->modules.end(), name) == lora_->modules.end()) return w;
    const Shape ws = b_.shape(w);
    const int64_t E = ws[0], r = lora_->config.r;
    auto in_dtype = [&](ValueId v, const std::string& t) { return b_.node(v).dtype == dt_ ? v : b_.cast(v, dt_, t); };
    ValueId a = b_.reshape(weight(name + ".lora_A.weight"), {E, r, ws[2]}, tag + ".lora_A");
    a = b_.scale_by(a, b_.fill({}, DType::F32, lora_->config.scaling(), tag + ".lora_scaling"), dt_, tag + ".lora_scaled");
    const ValueId delta = b_.batched_matmul(in_dtype(weight(name + ".lora_B.weight"), tag + ".lora_B.cast"), a, false, false, dt_, tag + ".lora_delta");
    return b_.add(w, delta, tag + ".lora_merged");
  }
  ValueId norm(ValueId x, const std::string& weight_name, const std::string& tag) { return b_.rms_norm(x, weight(weight_name), c_.rms_norm_eps, tag); }
  // Qwen3's q_norm / k_norm over each head of x:[B,T,H,D]. Under tensor parallel each rank normalises only its own
  // heads, so the weight's gradient is a partial sum: the weight passes through all_reduce_grad, and every rank
  // gets the whole gradient, as for the other weights that are whole on every rank.
  ValueId head_norm(ValueId x, const std::string& weight_name, const std::string& tag) {
    ValueId w = weight(weight_name);
    if (tp_.size > 1) w = b_.all_reduce_grad(w, tp_.group, tag + ".tp_weight");
    return b_.rms_norm(x, w, c_.rms_norm_eps, tag);
  }
  // Tensor parallel: the input of this rank's column-parallel projections (its gradient summed over the ranks),
  // and the sum of the ranks' row-parallel outputs. Identities on a whole model.
  ValueId tp_in(ValueId x, const std::string& tag) { return tp_.size > 1 ? b_.all_reduce_grad(x, tp_.group, tag + ".tp_in") : x; }
  ValueId tp_out(ValueId y, const std::string& tag) { return tp_.size > 1 ? b_.all_reduce(y, tp_.group, tag + ".tp_out") : y; }

  // Self-attention of decoder layer `i` on x:[B,T,C] -> [B,T,C]: q/k/v projections, q/k norms (Qwen3), RoPE, the
  // static KV cache when `cache` is set (its updated tensors appended to cache_out), attention, o_proj.
  ValueId attention(ValueId x, int64_t i, const Inputs& in, const CausalLM::CacheSpec* cache, std::vector<ValueId>* cache_out) {
    const std::string l = "model.layers." + std::to_string(i) + ".self_attn.", tag = "blk." + std::to_string(i) + ".";
    // This rank's heads (all of them on a whole model).
    const int64_t B = b_.shape(x)[0], T = b_.shape(x)[1], H = c_.num_attention_heads / tp_.size, Hkv = c_.num_key_value_heads / tp_.size;
    const int64_t D = c_.head_dim;
    x = tp_in(x, tag + "attn");
    ValueId q = b_.reshape(linear(x, l + "q_proj", tag + "attn_q"), {B, T, H, D});
    ValueId k = b_.reshape(linear(x, l + "k_proj", tag + "attn_k"), {B, T, Hkv, D});
    ValueId v = b_.reshape(linear(x, l + "v_proj", tag + "attn_v"), {B, T, Hkv, D});
    if (c_.qk_norm) {
      q = head_norm(q, l + "q_norm.weight", tag + "attn_q_norm");
      k = head_norm(k, l + "k_norm.weight", tag + "attn_k_norm");
    }
    q = b_.rope(q, in.positions, inv_freq_, 1.0f, tag + "attn_q_rope");
    k = b_.rope(k, in.positions, inv_freq_, 1.0f, tag + "attn_k_rope");
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    ValueId a;
    if (cache != nullptr) {
      const std::string kv = "past_key_values." + std::to_string(i) + ".";
      const int64_t S = cache->length, Bc = cache->rows > 0 ? cache->rows : B;
      const ValueId kc = b_.kv_cache_write(b_.input(kv + "key", {Bc, S, Hkv, D}, dt_), k, in.cache_position, tag + "k_cache", in.cache_rows);
      const ValueId vc = b_.kv_cache_write(b_.input(kv + "value", {Bc, S, Hkv, D}, dt_), v, in.cache_position, tag + "v_cache", in.cache_rows);
      cache_out->push_back(kc);
      cache_out->push_back(vc);
      a = cache->decode ? b_.attention(q, kc, vc, in.mask, scale, /*causal=*/true, tag + "attn", in.query_positions, in.cache_rows)
                        : b_.attention(q, k, v, in.mask, scale, /*causal=*/true, tag + "attn");
    } else {
      a = b_.attention(q, k, v, in.mask, scale, /*causal=*/true, tag + "attn");
    }
    return tp_out(linear(b_.reshape(a, {B, T, H * D}), l + "o_proj", tag + "attn_out"), tag + "attn_out");
  }

  // The mixture of experts of decoder layer `i` on x:[B,T,C] (Qwen3-MoE's sparse block): the router's logits
  // (mlp.gate, in the model's dtype), its top-k experts and their softmax probabilities (in f32, renormalised with
  // norm_topk_prob, then cast to the model's dtype), and the experts weighted by them. With `stats`, the layer's
  // load-balancing sums (over the tokens the attention mask keeps) are appended for the aux loss.
  ValueId moe(ValueId x, int64_t i, const Inputs& in, std::vector<ValueId>* stats) {
    const std::string l = "model.layers." + std::to_string(i) + ".mlp.", tag = "blk." + std::to_string(i) + ".";
    const Shape s = b_.shape(x);
    const int64_t N = s[0] * s[1];
    const ValueId rows = b_.reshape(x, {N, s[2]}, tag + "ffn_moe_in");
    const ValueId logits = linear(rows, l + "gate", tag + "ffn_gate_inp");
    const ValueId experts = b_.moe_topk(logits, c_.moe.num_experts_per_tok, tag + "ffn_moe_topk");
    const ValueId weights = b_.cast(b_.moe_route_weights(logits, experts, c_.moe.norm_topk_prob, tag + "ffn_moe_probs"), dt_, tag + "ffn_moe_weights");
    // Expert parallel (the tensor-parallel group): every rank routes every token (the router is whole), runs its own
    // experts [first, first + E / size) on the tokens that chose them, and an all_reduce sums the ranks' parts. The
    // experts' input and routing weights pass through all_reduce_grad: their gradients are the sums of every rank's.
    const int64_t E = c_.moe.num_experts, first = tp_.size > 1 ? tp_.rank * (E / tp_.size) : 0;
    const ValueId y = tp_out(b_.moe_experts(tp_in(rows, tag + "ffn_moe"), experts, tp_in(weights, tag + "ffn_moe_weights"),
                                            expert_weight(l + "experts.gate_up_proj", tag + "ffn_moe_gate_up"),
                                            expert_weight(l + "experts.down_proj", tag + "ffn_moe_down"), tag + "ffn_moe", first,
                                            tp_.size > 1 ? E : 0),
                             tag + "ffn_moe");
    if (stats != nullptr) {
      const ValueId mask = in.mask != kNone ? b_.reshape(in.mask, {N}, tag + "ffn_moe_mask") : kNone;
      stats->push_back(b_.moe_router_stats(logits, experts, mask, tag + "ffn_moe_stats"));
    }
    return b_.reshape(y, s, tag + "ffn_moe_out");
  }

  // The SwiGLU MLP of decoder layer `i`: down(silu(gate(x))·up(x)).
  ValueId mlp(ValueId x, int64_t i) {
    const std::string l = "model.layers." + std::to_string(i) + ".mlp.", tag = "blk." + std::to_string(i) + ".";
    x = tp_in(x, tag + "ffn");
    const ValueId g = linear(x, l + "gate_proj", tag + "ffn_gate");
    const ValueId u = linear(x, l + "up_proj", tag + "ffn_up");
    return tp_out(linear(b_.swiglu(g, u, tag + "ffn_swiglu"), l + "down_proj", tag + "ffn_down"), tag + "ffn_down");
  }

 private:
  Builder& b_;
  const ModelConfig& c_;
  const TensorMap& weights_;
  DType dt_;
  TensorParallel tp_;
  const LoraAdapter* lora_;
  bool training_;
  ValueId dropout_seed_ = kNone;
  std::vector<float> inv_freq_ = rope_inv_freq(c_);
};

}  // namespace

graph::VocabSplit CausalLM::vocab_split() const {
  if (tp_.size == 1) return {};
  const int64_t part = config_.vocab_size / tp_.size;
  return graph::VocabSplit{tp_.group, tp_.rank * part, config_.vocab_size};
}

CausalLM::VocabHead CausalLM::vocab_head(Builder& b, ValueId h, ValueId head) const {
  if (tp_.size == 1) return {h, head, {}};
  return {b.all_reduce_grad(h, tp_.group, "head.tp_in"), head, vocab_split()};
}

ValueId CausalLM::build_hidden(Builder& b, int64_t B, int64_t T, ValueId* head_out, const CacheSpec* cache, std::vector<ValueId>* cache_out) const {
  return build_decoder(b, B, T, head_out, cache, cache_out, /*training=*/false, nullptr);
}

ValueId CausalLM::build_decoder(Builder& b, int64_t B, int64_t T, ValueId* head_out, const CacheSpec* cache, std::vector<ValueId>* cache_out,
                                bool training, std::vector<ValueId>* router_stats) const {
  const ModelConfig& c = config_;
  DecoderBuilder d(b, c, weights_, dtype_, tp_, lora_.get(), training);
  const ValueId ids = b.input("input_ids", {B, T}, DType::I32);
  DecoderBuilder::Inputs in;
  in.positions = b.input("position_ids", {B, T}, DType::I32);
  const bool decode = cache != nullptr && cache->decode;
  in.mask = b.input("attention_mask", {B, decode ? cache->length : T}, DType::I32);
  const bool slots = cache != nullptr && cache->rows > 0;  // continuous batching: rows of a shared cache, each at its own slot
  if (cache != nullptr) in.cache_position = b.input("cache_position", {slots ? B : 1}, DType::I32);
  if (decode) in.query_positions = b.input("query_positions", {B, T}, DType::I32);
  if (slots) in.cache_rows = b.input("cache_rows", {B}, DType::I32);

  const ValueId embed = d.weight("model.embed_tokens.weight");
  // Vocabulary parallel: each rank looks up the ids of its rows (zeros for the others) and the ranks' rows are summed.
  ValueId h = b.embedding(ids, embed, dtype_, "embed", vocab_split());
  if (tp_.size > 1) h = b.all_reduce(h, tp_.group, "embed.tp_out");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".", tag = "blk." + std::to_string(i) + ".";
    b.set_segment(static_cast<int32_t>(i));  // one checkpoint segment per decoder layer
    h = b.add(h, d.attention(d.norm(h, l + "input_layernorm.weight", tag + "attn_norm"), i, in, cache, cache_out), tag + "attn_residual");
    const ValueId x = d.norm(h, l + "post_attention_layernorm.weight", tag + "ffn_norm");
    h = b.add(h, c.sparse_layer(i) ? d.moe(x, i, in, router_stats) : d.mlp(x, i), tag + "ffn_residual");
  }
  b.set_segment(-1);
  h = d.norm(h, "model.norm.weight", "output_norm");
  *head_out = c.tie_word_embeddings ? embed : d.weight("lm_head.weight");
  return h;
}

ValueId CausalLM::build_training_hidden(Builder& b, int64_t B, int64_t T, ValueId* head_out, bool dropout, ValueId* aux_loss) const {
  std::vector<ValueId> stats;
  const ValueId h = build_decoder(b, B, T, head_out, nullptr, nullptr, /*training=*/dropout, aux_loss != nullptr ? &stats : nullptr);
  if (aux_loss != nullptr) {
    // Transformers' load_balancing_loss_func over the sparse layers: their sums added, then one loss.
    ValueId sum = kNone;
    for (size_t i = 0; i < stats.size(); ++i) sum = sum == kNone ? stats[i] : b.add(sum, stats[i], "moe_stats_sum");
    *aux_loss = sum == kNone ? kNone : b.moe_aux_loss(sum, "aux_loss");
  }
  return h;
}

ValueId CausalLM::vocab_positions(Builder& b, ValueId h, int64_t B, int64_t T, double temperature, int64_t K) const {
  // logits / T = (h / T) · head: a sampling temperature scales the hidden state before the vocabulary ops, so the
  // chunked pass over the vocabulary is unchanged (TRL divides the logits by the temperature for log-probs and entropy).
  if (temperature != 1.0) {
    if (!(temperature > 0) || !std::isfinite(temperature)) fail("temperature must be a finite number > 0, got {}", temperature);
    h = b.scale_by(h, b.fill({}, DType::F32, 1.0 / temperature, "inv_temperature"), dtype_, "h.temperature");
  }
  // A gather of the kept positions is an embedding lookup into h seen as a [B·T, C] table, so its VJP (a scatter
  // into zeros) is the embedding's.
  if (K == 0) return h;
  if (K < 0 || K >= T) fail("logits_to_keep must be in [1, {}) for rows of {} tokens, got {}", T, T, K);
  const ValueId table = b.reshape(h, {B * T, config_.hidden_size}, "h.rows");
  return b.embedding(b.input("kept_positions", {B, K}, DType::I32), table, dtype_, "h.kept");
}

graph::Graph CausalLM::logprobs_graph(int64_t B, int64_t T, double temperature, int64_t logits_to_keep) const {
  Builder b;
  ValueId head = kNone;
  const int64_t Tk = logits_to_keep > 0 ? logits_to_keep : T;
  const ValueId h = vocab_positions(b, build_hidden(b, B, T, &head), B, T, temperature, logits_to_keep);
  const ValueId labels = b.input("labels", {B, Tk}, DType::I32);
  const VocabHead v = vocab_head(b, h, head);
  b.output(b.token_logprobs(v.h, v.w, labels, "token_logprobs", v.split), "token_logprobs");
  return b.finish();
}

graph::Graph CausalLM::logprobs_aux_graph(int64_t B, int64_t T) const {
  Builder b;
  ValueId head = kNone, aux = kNone;
  const ValueId h = build_training_hidden(b, B, T, &head, /*dropout=*/false, &aux);
  const VocabHead v = vocab_head(b, h, head);
  b.output(b.token_logprobs(v.h, v.w, b.input("labels", {B, T}, DType::I32), "token_logprobs", v.split), "token_logprobs");
  if (aux != kNone) b.output(aux, "aux_loss");
  return b.finish();
}

graph::Graph CausalLM::reward_graph(int64_t B, int64_t T) const {
  Builder b;
  ValueId head = kNone;
  const ValueId h = build_hidden(b, B, T, &head);
  const ValueId score = b.input("score.weight", {1, config_.hidden_size}, dtype_);
  b.output(b.cast(b.reshape(b.matmul(h, score, kNone, dtype_, "score"), {B, T}, "score.squeeze"), DType::F32, "rewards"), "rewards");
  return b.finish();
}

namespace {
graph::Graph cached_graph(const CausalLM& m, int64_t B, int64_t T, int64_t S, bool decode, int64_t cache_rows = 0) {
  if (B <= 0 || T <= 0 || T > S) fail("generation graph: batch {} and {} new tokens do not fit a cache of {}", B, T, S);
  if (cache_rows < 0) fail("generation graph: a cache of {} rows", cache_rows);
  Builder b;
  ValueId head = kNone;
  const CausalLM::CacheSpec spec{S, decode, cache_rows};
  std::vector<ValueId> caches;
  ValueId h = m.build_hidden(b, B, T, &head, &spec, &caches);
  if (T > 1) h = b.slice(h, T - 1, 1, "last_position");
  const ValueId logits = b.matmul(h, head, kNone, m.dtype(), "lm_head");
  b.output(b.reshape(logits, {B, m.config().vocab_size / m.tensor_parallel().size}), "logits");  // this rank's columns
  for (size_t i = 0; i < caches.size(); ++i)
    b.output(caches[i], fmt::format("past_key_values.{}.{}", i / 2, i % 2 == 0 ? "key" : "value"));
  return b.finish();
}
}  // namespace

graph::Graph CausalLM::prefill_graph(int64_t B, int64_t T, int64_t S) const { return cached_graph(*this, B, T, S, false); }
graph::Graph CausalLM::decode_graph(int64_t B, int64_t S) const { return cached_graph(*this, B, 1, S, true); }
graph::Graph CausalLM::slots_graph(int64_t B, int64_t T, int64_t cache_rows, int64_t S) const {
  if (cache_rows < 1) fail("slots graph: the cache needs at least one row, got {}", cache_rows);
  return cached_graph(*this, B, T, S, true, cache_rows);
}

graph::Graph CausalLM::forward_graph(int64_t B, int64_t T) const {
  Builder b;
  b.output(build_forward(b, B, T), "logits");
  return b.finish();
}

Tensor CausalLM::forward(const Batch& batch, Backend& backend) const {
  const Tensor& ids = batch.input_ids;
  if (ids.dtype() != DType::I32 || ids.dim() != 2) fail("input_ids must be i32 [B,T], got {} {}", dtype_name(ids.dtype()), shape_str(ids.shape()));
  const int64_t B = ids.size(0), T = ids.size(1);
  if (B == 0 || T == 0) fail("input_ids {} is empty", shape_str(ids.shape()));
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int32_t id = ids.data_as<int32_t>()[i];
    if (id < 0 || id >= config_.vocab_size) {
      fail("input_ids[{}][{}] = {} is outside the vocabulary [0, {})", i / T, i % T, id, config_.vocab_size);
    }
  }
  Tensor mask = batch.attention_mask;
  if (!mask.defined() || mask.numel() == 0) {
    mask = Tensor::zeros(DType::I32, {B, T});
    for (int64_t i = 0; i < B * T; ++i) mask.mutable_data_as<int32_t>()[i] = 1;
  }
  if (mask.dtype() != DType::I32 || mask.shape() != ids.shape()) {
    fail("attention_mask must be i32 {} like input_ids, got {} {}", shape_str(ids.shape()), dtype_name(mask.dtype()), shape_str(mask.shape()));
  }
  Tensor pos = batch.position_ids.numel() > 0 ? batch.position_ids : default_position_ids(mask);
  if (pos.dtype() != DType::I32 || pos.shape() != ids.shape()) {
    fail("position_ids must be i32 {} like input_ids, got {} {}", shape_str(ids.shape()), dtype_name(pos.dtype()), shape_str(pos.shape()));
  }
  TensorMap inputs = to_backend(backend, weights_);
  inputs["input_ids"] = to_backend(backend, ids, "input_ids");
  inputs["attention_mask"] = to_backend(backend, mask, "attention_mask");
  inputs["position_ids"] = to_backend(backend, pos, "position_ids");
  auto program = backend.compile(forward_graph(B, T));
  const Tensor logits = to_host(backend, program->run(inputs).at(0));  // what the caller asked for
  return logits.dtype() == DType::F32 ? logits : logits.to(DType::F32);
}

void CausalLM::save_pretrained(const std::string& dir, uint64_t max_shard_bytes) const {
  if (lora_) fail("save_pretrained {}: the model has a LoRA adapter: save the adapter (save_adapter) or merge it first (merged())", dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create the folder: {}", dir, ec.message());
  ModelConfig c = config_;
  c.torch_dtype = dtype_ == DType::BF16 ? "bfloat16" : dtype_ == DType::F16 ? "float16" : "float32";
  save_checkpoint(dir, checkpoint_tensors(config_, weights_), max_shard_bytes);  // a mixture of experts: one tensor per expert
  write_text_file_atomic((fs::path(dir) / "config.json").string(), c.to_json().dump(2) + "\n");
}

}  // namespace trl

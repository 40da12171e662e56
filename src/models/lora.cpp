#include "trl/models/lora.h"
#include "core/json_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/fs.h"
#include "core/rng.h"
#include "trl/core/error.h"
#include "trl/io/safetensors.h"
#include "trl/models/causal_lm.h"

namespace trl {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kFilePrefix = "base_model.model.";
// The linear layers of the decoder (the nn.Linear modules LoRA may adapt) by their short names.
constexpr const char* kLinearNames[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

bool ends_with_module(const std::string& module, const std::string& key) {
  return module == key || (module.size() > key.size() && module.ends_with(key) && module[module.size() - key.size() - 1] == '.');
}

// The decoder's linear modules in model order ("model.layers.3.mlp.up_proj").
std::vector<std::string> linear_modules(const ModelConfig& config) {
  std::vector<std::string> out;
  for (const auto& [name, shape] : parameter_shapes(config)) {
    if (!name.ends_with(".weight") || shape.size() != 2) continue;
    const std::string module = name.substr(0, name.size() - 7);
    for (const char* l : kLinearNames)
      if (ends_with_module(module, l)) out.push_back(module);
  }
  return out;
}

// A whole-name match of a PEFT target_modules regular expression (Python's re.fullmatch).
bool full_match(const std::string& pattern, const std::string& s) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED,
                                   &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("LoRA target_modules: cannot compile the regular expression '{}' at offset {}: {}", pattern, offset, reinterpret_cast<char*>(msg));
  }
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  pcre2_code_free(code);
  return rc >= 0;
}

std::vector<std::string> string_list(const nlohmann::json& j, const char* key, const std::string& source) {
  std::vector<std::string> out;
  if (!j.contains(key) || j[key].is_null()) return out;
  if (j[key].is_string()) return {j[key].get<std::string>()};
  if (!j[key].is_array()) fail("{}: '{}' must be a list of module names, got {}", source, key, j[key].dump());
  for (const auto& v : j[key]) {
    if (!v.is_string()) fail("{}: '{}' must be a list of module names, got {}", source, key, j[key].dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

// PEFT's name (without its prefix) of an adapter tensor trl names `name`, given the adapted modules. A stacked
// experts parameter's adapter sits on the experts module (PEFT's ParamWrapper); with both gate_up_proj and down_proj
// adapted, PEFT wraps them in the module's parameter order, so gate_up_proj's is the inner one, under base_layer.
std::string peft_tensor_name(const std::string& name, const std::set<std::string>& modules) {
  for (const char* part : {".lora_A.weight", ".lora_B.weight"}) {
    if (!name.ends_with(part)) continue;
    const std::string module = name.substr(0, name.size() - std::strlen(part));
    for (const char* p : {".experts.gate_up_proj", ".experts.down_proj"}) {
      if (!module.ends_with(p)) continue;
      const std::string experts = module.substr(0, module.size() - std::strlen(p) + std::strlen(".experts"));
      const bool inner = std::string(p) == ".experts.gate_up_proj" && modules.count(experts + ".down_proj");
      return experts + (inner ? ".base_layer" : "") + part;
    }
  }
  return name;
}

// A stacked experts' lora_B between PEFT's layout [out, r·E] (column j·E + e) and trl's [E, out, r].
Tensor experts_lora_b_from_peft(const Tensor& file, int64_t E) {
  const Tensor f = file.to(DType::F32);
  const int64_t O = f.size(0), r = f.size(1) / E;
  Tensor out = Tensor::uninitialized(DType::F32, {E, O, r});
  const float* src = f.data_as<float>();
  float* dst = out.mutable_data_as<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t j = 0; j < r; ++j) dst[(e * O + o) * r + j] = src[o * r * E + j * E + e];
  return out.to(file.dtype());
}
Tensor experts_lora_b_to_peft(const Tensor& b) {
  const Tensor t = b.to(DType::F32);
  const int64_t E = t.size(0), O = t.size(1), r = t.size(2);
  Tensor out = Tensor::uninitialized(DType::F32, {O, r * E});
  const float* src = t.data_as<float>();
  float* dst = out.mutable_data_as<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t j = 0; j < r; ++j) dst[o * r * E + j * E + e] = src[(e * O + o) * r + j];
  return out.to(b.dtype());
}

}  // namespace

double LoraConfig::scaling() const {
  if (r <= 0) fail("LoRA r must be a positive number, got {}", r);
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / static_cast<double>(r);
}

ojson LoraConfig::to_json() const {
  // nlohmann's json keeps keys sorted: the order PEFT's adapter_config.json has (json.dumps(sort_keys=True)).
  nlohmann::json j;
  j["alpha_pattern"] = nlohmann::json::object();
  j["base_model_name_or_path"] = base_model_name_or_path.empty() ? nlohmann::json() : nlohmann::json(base_model_name_or_path);
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["lora_alpha"] = lora_alpha == std::floor(lora_alpha) ? nlohmann::json(static_cast<int64_t>(lora_alpha)) : nlohmann::json(lora_alpha);
  j["lora_dropout"] = lora_dropout;
  j["modules_to_save"] = modules_to_save.empty() ? nlohmann::json() : nlohmann::json(modules_to_save);
  j["peft_type"] = "LORA";
  j["r"] = r;
  j["rank_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  if (!target_regex.empty()) j["target_modules"] = target_regex;
  else if (target_modules.size() == 1 && target_modules[0] == "all-linear") j["target_modules"] = "all-linear";
  else if (!target_modules.empty()) j["target_modules"] = target_modules;
  else j["target_modules"] = target_parameters.empty() ? nlohmann::json({"q_proj", "v_proj"}) : nlohmann::json();
  j["target_parameters"] = target_parameters.empty() ? nlohmann::json() : nlohmann::json(target_parameters);
  j["task_type"] = task_type;
  j["use_dora"] = false;
  j["use_rslora"] = use_rslora;
  return ojson::parse(j.dump());
}

LoraConfig LoraConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: an adapter config must be a JSON object", source);
  if (!j.contains("peft_type") || j["peft_type"].is_null())
    fail("{}: peft_type is missing; trl reads LoRA adapters (\"peft_type\": \"LORA\") only", source);
  if (!j["peft_type"].is_string()) fail("{}: peft_type must be text (\"LORA\"), got {}", source, json_kind(j["peft_type"]));
  const std::string type = j["peft_type"].get<std::string>();
  if (type != "LORA") fail("{}: peft_type is '{}'; trl reads LoRA adapters (peft_type \"LORA\") only", source, type);
  LoraConfig c;
  // A missing number takes PEFT's default; null is refused, as PEFT fails on it (r, lora_alpha and lora_dropout
  // enter the adapter's arithmetic).
  auto number = [&](const char* key, double fallback) {
    if (!j.contains(key)) return fallback;
    if (j[key].is_null()) fail("{}: '{}' is null; an adapter needs its value (PEFT fails on null too): write the value it was trained with", source, key);
    if (!j[key].is_number()) fail("{}: '{}' must be a number, got {}", source, key, j[key].dump());
    return j[key].get<double>();
  };
  // A flag that is missing or null is false, as PEFT reads it (`if config.use_rslora:`).
  auto flag = [&](const char* key) {
    if (!j.contains(key) || j[key].is_null()) return false;
    if (!j[key].is_boolean()) fail("{}: '{}' must be true or false, got {}", source, key, j[key].dump());
    return j[key].get<bool>();
  };
  const double r = number("r", 8);
  if (r <= 0 || r != static_cast<double>(static_cast<int64_t>(r))) fail("{}: r must be a positive whole number, got {}", source, j["r"].dump());
  c.r = static_cast<int64_t>(r);
  c.lora_alpha = number("lora_alpha", 8);
  c.lora_dropout = number("lora_dropout", 0);
  c.use_rslora = flag("use_rslora");
  // Text fields PEFT may leave null: null or missing is "not set"; any other kind is named.
  auto text = [&](const char* key, const std::string& fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_string()) fail("{}: '{}' must be text, got {}", source, key, json_kind(j[key]));
    return j[key].get<std::string>();
  };
  c.task_type = text("task_type", "CAUSAL_LM");
  c.base_model_name_or_path = text("base_model_name_or_path", "");
  if (j.contains("target_modules") && j["target_modules"].is_string()) {
    const std::string t = j["target_modules"];
    if (t == "all-linear") c.target_modules = {t};
    else c.target_regex = t;
  } else {
    c.target_modules = string_list(j, "target_modules", source);
  }
  c.modules_to_save = string_list(j, "modules_to_save", source);
  c.target_parameters = string_list(j, "target_parameters", source);
  // What would change the adapter's math and trl does not implement: refused rather than silently ignored.
  if (flag("use_dora")) fail("{}: use_dora is true; trl implements plain LoRA (DoRA adapters are not supported)", source);
  if (flag("fan_in_fan_out")) fail("{}: fan_in_fan_out is true (GPT-2's Conv1D layout); Qwen3's linear layers are nn.Linear", source);
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (j.contains(key) && j[key].is_object() && !j[key].empty())
      fail("{}: '{}' gives some modules their own rank or alpha; trl supports one r and lora_alpha for all modules", source, key);
  if (j.contains("layers_to_transform") && !j["layers_to_transform"].is_null())
    fail("{}: layers_to_transform is set; trl adapts the targeted modules of every layer", source);
  if (j.contains("bias") && !(j["bias"].is_string() && j["bias"].get<std::string>() == "none"))
    fail("{}: bias is {}; trl trains LoRA adapters without biases (bias \"none\", PEFT's default)", source, j["bias"].dump());
  if (c.lora_dropout < 0 || c.lora_dropout >= 1) fail("{}: lora_dropout must be in [0, 1), got {}", source, c.lora_dropout);
  return c;
}

namespace {

// The modules target_modules names (model order): none when only target_parameters is set.
std::vector<std::string> module_targets(const ModelConfig& config, const LoraConfig& lora) {
  const std::vector<std::string> linear = linear_modules(config);
  std::vector<std::string> out;
  if (!lora.target_regex.empty()) {
    for (const std::string& m : linear)
      if (full_match(lora.target_regex, m)) out.push_back(m);
    if (out.empty())
      fail("LoRA target_modules '{}' matches none of the model's linear modules (such as {})", lora.target_regex, linear.empty() ? "" : linear.front());
    return out;
  }
  std::vector<std::string> keys = lora.target_modules;
  if (keys.empty() && !lora.target_parameters.empty()) return out;
  if (keys.empty()) keys = {"q_proj", "v_proj"};  // PEFT's default for qwen2, qwen3 and llama
  if (keys.size() == 1 && keys[0] == "all-linear") return linear;
  for (const std::string& key : keys) {
    if (key == "all-linear") fail("LoRA target_modules: all-linear cannot be combined with other names");
    for (const char* head : {"lm_head", "embed_tokens"})
      if (ends_with_module(head, key) || key == std::string("model.") + head)
        fail("LoRA target_modules: '{}' (the {}) cannot take a LoRA adapter in trl; train it in full with --lora_modules_to_save {}", key,
             std::string(head) == "lm_head" ? "output head" : "embeddings", head);
    bool any = false;
    for (const std::string& m : linear) any = any || ends_with_module(m, key);
    if (!any) {
      const bool moe = key == "gate" || key == "experts" || key.ends_with(".gate") || key.ends_with(".experts");
      fail("LoRA target_modules: '{}' matches none of the model's linear modules; the names are q_proj, k_proj, v_proj, o_proj, gate_proj, "
           "up_proj and down_proj (or all-linear){}",
           key, moe ? "; a mixture of experts' router and experts are parameters: --lora_target_parameters mlp.gate.weight "
                      "mlp.experts.gate_up_proj mlp.experts.down_proj (PEFT's target_parameters)" : "");
    }
  }
  for (const std::string& m : linear)
    for (const std::string& key : keys)
      if (ends_with_module(m, key)) {
        out.push_back(m);
        break;
      }
  return out;
}

// The modules target_parameters names, as PEFT matches them (a parameter's whole name, or its end after a dot): a
// 2-D weight "<module>.weight" gives <module>; a stacked experts parameter gives itself.
std::vector<std::string> parameter_targets(const ModelConfig& config, const LoraConfig& lora) {
  std::vector<std::string> out;
  if (lora.target_parameters.empty()) return out;
  if (lora.lora_dropout != 0)
    fail("LoRA target_parameters ({}) with lora_dropout {}: PEFT's LoRA on parameters has no dropout (it cannot be factored out of "
         "the merged weight); set lora_dropout to 0",
         fmt::join(lora.target_parameters, ", "), lora.lora_dropout);
  for (const std::string& t : lora.target_parameters) {
    bool any = false;
    for (const auto& [name, shape] : parameter_shapes(config)) {
      if (name != t && !name.ends_with("." + t)) continue;
      any = true;
      const bool head = name.find("embed_tokens") != std::string::npos || name.starts_with("lm_head");
      if (shape.size() == 3) out.push_back(name);
      else if (shape.size() == 2 && name.ends_with(".weight") && !head) out.push_back(name.substr(0, name.size() - 7));
      else
        fail("LoRA target_parameters: '{}' matches {} of shape {}, which trl cannot adapt (a linear weight or a mixture of experts' "
             "stacked experts can){}",
             t, name, shape_str(shape), head ? "; train it in full with --lora_modules_to_save" : "");
    }
    if (!any)
      fail("LoRA target_parameters: '{}' matches no parameter of the model ({}); a mixture of experts' are mlp.gate.weight (the router), "
           "mlp.experts.gate_up_proj and mlp.experts.down_proj",
           t, config.model_type);
  }
  return out;
}

}  // namespace

std::vector<std::string> lora_target_modules(const ModelConfig& config, const LoraConfig& lora) {
  const std::vector<std::string> modules = module_targets(config, lora), params = parameter_targets(config, lora);
  std::set<std::string> chosen(modules.begin(), modules.end());
  for (const std::string& p : params)
    if (!chosen.insert(p).second)
      fail("LoRA: '{}' is targeted by both target_modules and target_parameters; name it in one of them", p);
  // Model order: the order of the parameters.
  std::vector<std::string> out;
  for (const auto& [name, shape] : parameter_shapes(config)) {
    const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
    if (chosen.count(module) && std::find(out.begin(), out.end(), module) == out.end()) out.push_back(module);
  }
  return out;
}

std::vector<std::string> lora_saved_parameters(const LoraConfig& lora, const std::vector<std::string>& parameter_names) {
  std::vector<std::string> out;
  for (const std::string& module : lora.modules_to_save) {
    bool any = false;
    for (const std::string& p : parameter_names)
      for (const char* kind : {".weight", ".bias"})
        if (p.ends_with(kind) && ends_with_module(p.substr(0, p.size() - std::strlen(kind)), module)) {
          if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
          any = true;
        }
    if (!any)
      fail("LoRA modules_to_save: '{}' matches no module of the model{}", module,
           module == "lm_head" ? " (its embeddings are tied to the output head: use embed_tokens)" : "");
  }
  return out;
}

Shape lora_module_shape(const ModelConfig& config, const std::string& module) {
  for (const auto& [name, shape] : parameter_shapes(config))
    if (name == module + ".weight") return shape;
  fail("LoRA: the model has no linear module '{}'", module);
}

LoraShapes lora_shapes(const ModelConfig& config, const std::string& module, int64_t r) {
  for (const auto& [name, shape] : parameter_shapes(config)) {
    if (name == module && shape.size() == 3) return {{shape[0] * r, shape[2]}, {shape[0], shape[1], r}, shape[0]};
    if (name == module + ".weight" && shape.size() == 2) return {{r, shape[1]}, {shape[0], r}, 0};
  }
  fail("LoRA: the model has no linear module or stacked experts '{}'", module);
}

LoraAdapter init_lora(const ModelConfig& config, const LoraConfig& lora, uint64_t seed) {
  if (lora.r <= 0) fail("lora_r must be a positive number, got {}", lora.r);
  LoraAdapter a{lora, lora_target_modules(config, lora), {}};
  for (size_t k = 0; k < a.modules.size(); ++k) {
    const std::string& m = a.modules[k];
    const LoraShapes s = lora_shapes(config, m, lora.r);
    const int64_t in = s.a[1];
    // kaiming_uniform_(a=√5): bound = gain·√(3 / fan_in) with gain = √(2 / (1 + a²)) = √(1/3), so 1/√in (PEFT's
    // ParamWrapper initialises its [E·r, in] lora_A the same way).
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    Tensor A = Tensor::uninitialized(DType::F32, s.a);
    SplitMix64 rng(seed * 0x9E3779B97F4A7C15ull + k + 1);
    float* p = A.mutable_data_as<float>();
    for (int64_t i = 0; i < A.numel(); ++i) p[i] = static_cast<float>((static_cast<double>(rng.next() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * bound);
    a.weights[m + ".lora_A.weight"] = std::move(A);
    a.weights[m + ".lora_B.weight"] = Tensor::zeros(DType::F32, s.b);
  }
  return a;
}

bool is_adapter_dir(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / "adapter_config.json"); }

LoraConfig read_adapter_config(const std::string& dir) {
  const std::string config_file = (fs::path(dir) / "adapter_config.json").string();
  if (!fs::is_regular_file(config_file)) fail("{}: not a PEFT adapter folder (no adapter_config.json)", dir);
  return LoraConfig::from_json(parse_json(read_text_file(config_file), config_file), config_file);
}

std::string adapter_base_model(const std::string& dir) {
  const LoraConfig lora = read_adapter_config(dir);
  if (lora.base_model_name_or_path.empty())
    fail("{}: base_model_name_or_path is not set, so the adapter's base model is unknown; load the base with --model and pass the adapter "
         "with --adapter {}",
         (fs::path(dir) / "adapter_config.json").string(), dir);
  const std::string& base = lora.base_model_name_or_path;
  if (!fs::exists(base) && fs::path(base).is_relative() && fs::exists(fs::path(dir) / base)) return (fs::path(dir) / base).string();
  return base;
}

LoraAdapter load_adapter(const std::string& dir, const ModelConfig& config) {
  LoraAdapter a;
  a.config = read_adapter_config(dir);
  a.modules = lora_target_modules(config, a.config);
  // PEFT's SEQ_CLS adapters list both "classifier" and "score" in modules_to_save whatever the model has: a name that
  // matches no parameter of this model is dropped on load (as PEFT skips it), not an error as in a training config.
  std::vector<std::string> params;
  std::map<std::string, Shape> shapes;
  for (const auto& [name, shape] : parameter_shapes(config)) params.push_back(name), shapes[name] = shape;
  shapes["score.weight"] = {1, config.hidden_size};
  params.push_back("score.weight");
  std::vector<std::string> present;
  for (const std::string& m : a.config.modules_to_save) {
    LoraConfig one;
    one.modules_to_save = {m};
    bool matches = true;
    try {
      (void)lora_saved_parameters(one, params);
    } catch (const Error&) {
      matches = false;
    }
    if (matches) present.push_back(m);
  }
  a.config.modules_to_save = present;
  const std::string weights_file = (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::is_regular_file(weights_file)) {
    const bool bin = fs::is_regular_file(fs::path(dir) / "adapter_model.bin");
    fail("{}: no adapter_model.safetensors{}", dir, bin ? " (adapter_model.bin is a pickle, which trl does not read: save the adapter with "
                                                          "safe_serialization=True, PEFT's default)" : "");
  }
  const SafeTensorsFile f = SafeTensorsFile::open(weights_file);
  // File name → trl name: drop PEFT's prefix and the ".default" adapter name some writers keep.
  std::map<std::string, std::string> names;
  for (const std::string& n : f.names()) {
    std::string t = n.starts_with(kFilePrefix) ? n.substr(std::strlen(kFilePrefix)) : n;
    for (const char* ab : {"lora_A", "lora_B"})
      if (const std::string d = fmt::format(".{}.default.weight", ab); t.ends_with(d)) t = t.substr(0, t.size() - d.size()) + fmt::format(".{}.weight", ab);
    names[t] = n;
  }
  // `name` (trl's) from the file's tensor `in_file` (PEFT's name without the prefix), which must have `shape`.
  auto take = [&](const std::string& name, const std::string& in_file, const Shape& shape) {
    const auto it = names.find(in_file);
    if (it == names.end()) fail("{}: no tensor for '{}{}' (adapter_config.json targets this module)", weights_file, kFilePrefix, in_file);
    Tensor t = f.get(it->second);
    if (t.shape() != shape)
      fail("{}: '{}' is {}, the model and r = {} imply {}: an adapter of another model or config", weights_file, it->second, shape_str(t.shape()),
           a.config.r, shape_str(shape));
    if (!dtype_is_float(t.dtype())) fail("{}: '{}' has dtype {}; adapter weights must be floating point", weights_file, it->second, dtype_name(t.dtype()));
    a.weights[name] = t;
    names.erase(it);
  };
  const std::set<std::string> targeted(a.modules.begin(), a.modules.end());
  for (const std::string& m : a.modules) {
    const LoraShapes s = lora_shapes(config, m, a.config.r);
    const std::string A = m + ".lora_A.weight", B = m + ".lora_B.weight";
    take(A, peft_tensor_name(A, targeted), s.a);
    if (s.experts == 0) {
      take(B, peft_tensor_name(B, targeted), s.b);
    } else {  // PEFT's [out, r·E] → trl's [E, out, r]
      take(B, peft_tensor_name(B, targeted), {s.b[1], s.b[2] * s.experts});
      a.weights[B] = experts_lora_b_from_peft(a.weights[B], s.experts);
    }
  }
  // modules_to_save: what is left, by parameter name (a reward model's score.weight included).
  for (const std::string& p : lora_saved_parameters(a.config, params))
    if (names.count(p)) take(p, p, shapes.at(p));
  if (!names.empty())
    fail("{}: tensor '{}' belongs to no module that adapter_config.json targets or saves", weights_file, names.begin()->second);
  return a;
}

void save_adapter(const std::string& dir, const LoraConfig& config, const TensorMap& weights) {
  std::set<std::string> modules;
  for (const auto& [name, w] : weights)
    if (name.ends_with(".lora_A.weight")) modules.insert(name.substr(0, name.size() - std::strlen(".lora_A.weight")));
  TensorMap file;
  for (const auto& [name, w] : weights) {
    const bool expert_b = name.ends_with(".lora_B.weight") && w.dim() == 3;  // trl's [E, out, r] → PEFT's [out, r·E]
    file[kFilePrefix + peft_tensor_name(name, modules)] = expert_b ? experts_lora_b_to_peft(w) : w;
  }
  save_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), file);
  write_text_file_atomic((fs::path(dir) / "adapter_config.json").string(), config.to_json().dump(2) + "\n");
}

TensorMap merge_lora(const TensorMap& base, const LoraAdapter& adapter) {
  TensorMap out = base;
  const double s = adapter.config.scaling();
  for (const std::string& m : adapter.modules) {
    const std::string wn = base.count(m) ? m : m + ".weight";  // stacked experts are named by their parameter
    const auto it = base.find(wn);
    if (it == base.end()) fail("merge: the base model has no '{}'", wn);
    const Tensor W = it->second.to(DType::F32), A = adapter.weights.at(m + ".lora_A.weight").to(DType::F32),
                 B = adapter.weights.at(m + ".lora_B.weight").to(DType::F32);
    // A linear module is one "expert": W [N, K], A [r, K], B [N, r]; stacked experts W [E, N, K], A [E·r, K],
    // B [E, N, r].
    const int64_t E = W.dim() == 3 ? W.size(0) : 1, N = W.size(W.dim() - 2), K = W.size(W.dim() - 1), r = A.size(0) / E;
    Tensor merged = W.clone();
    float* w = merged.mutable_data_as<float>();
    const float* a = A.data_as<float>();
    const float* b = B.data_as<float>();
    // W_e[n, k] += s · Σ_j B_e[n, j] · A_e[j, k]
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < r; ++j) {
          const float bj = static_cast<float>(s * b[(e * N + n) * r + j]);
          const float* aj = a + (e * r + j) * K;
          float* row = w + (e * N + n) * K;
          for (int64_t k = 0; k < K; ++k) row[k] += bj * aj[k];
        }
    out[wn] = merged.to(it->second.dtype());
  }
  for (const auto& [name, w] : adapter.weights) {
    if (name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight") || !out.count(name)) continue;
    out[name] = w.to(out.at(name).dtype());
  }
  return out;
}

}  // namespace trl

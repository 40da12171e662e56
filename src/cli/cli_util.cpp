#include "cli/cli_util.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "trl/models/lora.h"

namespace trl::cli {

namespace fs = std::filesystem;

CausalLM load_inference_model(const std::string& model, const std::string& adapter, const LoadOptions& options, bool merge) {
  CausalLM m = CausalLM::from_pretrained(model, options);
  if (!adapter.empty()) {
    if (!is_adapter_dir(adapter)) fail("--adapter {}: not a PEFT adapter folder (no adapter_config.json)", adapter);
    if (m.lora()) fail("--adapter {}: --model {} is an adapter folder already (one adapter at a time)", adapter, model);
    m = m.with_adapter(load_adapter(adapter, m.config()));
  }
  return merge ? m.merged() : m;
}

std::string tokenizer_source(const std::string& model) {
  if (!fs::is_directory(model) || !is_adapter_dir(model) || fs::is_regular_file(fs::path(model) / "tokenizer.json")) return model;
  return adapter_base_model(model);
}

std::string flag(const std::string& name) {
  std::string dashed = name;
  for (char& c : dashed) {
    if (c == '_') c = '-';
  }
  return dashed == name ? "--" + name : "--" + name + ",--" + dashed;
}

}  // namespace trl::cli

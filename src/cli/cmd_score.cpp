// `trl score`: per-token log-probabilities, total NLL and perplexity of token sequences under a model.
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "trl/backend/registry.h"
#include "core/json_text.h"
#include "cli/cli_util.h"
#include "cli/options.h"
#include "trl/core/error.h"
#include "trl/io/hub.h"
#include "trl/models/lora.h"
#include "trl/models/reward_model.h"
#include "trl/models/score.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl::cli {

namespace {

std::vector<int32_t> parse_ids(const std::string& text, const std::string& where) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string part = text.substr(start, end - start);
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    while (!part.empty() && part.back() == ' ') part.pop_back();
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 9) {
      fail("{}: element {} ('{}') is not a token id; expected comma-separated non-negative integers such as 1,2,3", where, ids.size() + 1, part);
    }
    ids.push_back(static_cast<int32_t>(std::stol(part)));
    start = end + 1;
  }
  return ids;
}

std::vector<int32_t> ids_from_json(const nlohmann::json& j, const std::string& where, const std::function<const Tokenizer&()>& tokenizer) {
  if (!j.is_object()) fail("{}: expected an object such as {{\"ids\": [1, 2, 3]}} or {{\"text\": \"...\"}}", where);
  if (j.contains("text")) {
    if (!j["text"].is_string()) fail("{}: \"text\" must be a string", where);
    auto ids = tokenizer().encode(j["text"].get<std::string>(), true);
    if (ids.size() < 2) fail("{}: the text is {} token(s): nothing to score (the first token is context; give a longer text)", where, ids.size());
    return ids;
  }
  if (!j.contains("ids") || !j["ids"].is_array()) fail("{}: missing the \"ids\" array", where);
  std::vector<int32_t> ids = token_ids_from_json(j["ids"], where);
  if (ids.size() < 2) fail("{}: \"ids\" has {} token(s): nothing to score (the first token is context; give at least two)", where, ids.size());
  return ids;
}

}  // namespace

void register_score(CLI::App& app) {
  auto* cmd = add_command(app, "score", "Log-probability of each next token, total NLL and perplexity (JSON); a reward model's reward");
  struct Args {
    std::string model, adapter, ids, text, jsonl, dtype, revision = "main", device = "auto";
    int64_t batch_size = 8;
    bool show_tokens = false;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("model,model_name_or_path", a->model, "Model folder, Hugging Face id (local cache only) or PEFT adapter folder").required();
  opts.add("adapter", a->adapter, "A PEFT LoRA adapter folder to apply to --model");
  Opt ids = opts.add("ids", a->ids, "Comma-separated token ids, e.g. 1,2,3 (at least two: the first is context)");
  Opt text = opts.add("text", a->text, "Text to score (tokenized with the model's tokenizer)");
  Opt jsonl = opts.add("jsonl", a->jsonl, "File of JSON lines {\"ids\": [...]} or {\"text\": ...}");
  ids.excludes(text).excludes(jsonl);
  text.excludes(jsonl);
  opts.add("dtype", a->dtype, "Convert the weights").choices({"f32", "float32", "bf16", "bfloat16"}).default_text("the checkpoint's");
  opts.add("tokens", a->show_tokens, "Also print each scored token as text");
  opts.add("revision", a->revision, "Hub cache revision");
  opts.add("device", a->device, "auto | cpu | cuda: the backend the programs run on (one that is not here is an error)");
  opts.add("batch_size", a->batch_size, "Sequences per forward pass").min(1);
  on_run(cmd, [a] {
    std::optional<Tokenizer> tok;
    auto tokenizer = [&]() -> const Tokenizer& {
      if (!tok) tok = Tokenizer::from_pretrained(tokenizer_source(a->model), a->revision);
      return *tok;
    };
    std::vector<std::vector<int32_t>> seqs;
    if (!a->ids.empty()) {
      seqs.push_back(parse_ids(a->ids, "--ids"));
      if (seqs.back().size() < 2) fail("--ids {}: one token has nothing to score (the first token is context; give at least two ids, e.g. 785,8585)", a->ids);
    } else if (!a->text.empty()) {
      seqs.push_back(tokenizer().encode(a->text, true));
      if (seqs.back().size() < 2) fail("--text: the text is {} token(s): nothing to score (the first token is context; give a longer text)", seqs.back().size());
    } else if (!a->jsonl.empty()) {
      std::ifstream in(a->jsonl);
      if (!in) fail("{}: cannot open", a->jsonl);
      std::string line;
      for (int64_t n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = fmt::format("{}:{}", a->jsonl, n);
        const nlohmann::json j = parse_json(line, where);
        seqs.push_back(ids_from_json(j, where, tokenizer));
      }
      if (seqs.empty()) fail("{}: no input lines", a->jsonl);
    } else {
      fail("give the input with --ids, --text or --jsonl");
    }
    LoadOptions lo;
    lo.revision = a->revision;
    lo.device = a->device;
    if (!a->dtype.empty()) lo.dtype = (a->dtype == "bf16" || a->dtype == "bfloat16") ? DType::BF16 : DType::F32;
    // A reward model (a sequence-classification checkpoint): one reward per input.
    if (a->adapter.empty() && (is_sequence_classification_adapter(a->model) ||
                               (!is_adapter_dir(a->model) && is_sequence_classification_config(resolve_model_dir(a->model, a->revision))))) {
      const RewardModel rm = load_reward_model(a->model, lo);
      auto backend = make_backend(rm.backbone.device());
      const std::vector<double> rewards = reward_scores(rm, seqs, *backend, a->batch_size);
      for (size_t i = 0; i < seqs.size(); ++i) {
        nlohmann::ordered_json j;
        j["n_tokens"] = seqs[i].size();
        j["reward"] = rewards[i];
        std::printf("%s\n", j.dump().c_str());
      }
      return;
    }
    CausalLM model = load_inference_model(a->model, a->adapter, lo, /*merge=*/false);
    auto backend = make_backend(model.device());
    const auto scores = score_sequences(model, seqs, *backend, a->batch_size);
    for (const SequenceScore& s : scores) {
      nlohmann::ordered_json j;
      j["n_tokens"] = s.ids.size();
      j["n_scored"] = s.n_scored;
      j["token_logprobs"] = s.token_logprobs;
      j["nll"] = s.nll;
      j["mean_nll"] = s.n_scored > 0 ? s.nll / static_cast<double>(s.n_scored) : 0.0;
      j["perplexity"] = s.perplexity();
      if (a->show_tokens) {
        std::vector<std::string> pieces;
        for (size_t t = 1; t < s.ids.size(); ++t) pieces.push_back(tokenizer().decode(std::vector<int32_t>{s.ids[t]}));
        j["tokens"] = pieces;
      }
      std::printf("%s\n", j.dump().c_str());
    }
  });
}

}  // namespace trl::cli

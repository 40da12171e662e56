// `trl score`: per-token log-probabilities, total NLL and perplexity of token sequences under a model.
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "cli/cli_util.h"
#include "core/error.h"
#include "models/score.h"
#include "tokenizer/tokenizer.h"

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
    if (ids.empty()) fail("{}: the text has no tokens", where);
    return ids;
  }
  if (!j.contains("ids") || !j["ids"].is_array()) fail("{}: missing the \"ids\" array", where);
  std::vector<int32_t> ids;
  for (const auto& v : j["ids"]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      fail("{}: ids[{}] = {} is not a non-negative token id", where, ids.size(), v.dump());
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  if (ids.empty()) fail("{}: \"ids\" is empty", where);
  return ids;
}

}  // namespace

void register_score(CLI::App& app) {
  auto* cmd = app.add_subcommand("score", "Log-probability of each next token, total NLL and perplexity (JSON)");
  struct Args {
    std::string model, ids, text, jsonl, dtype, revision = "main";
    int64_t batch_size = 8;
    bool show_tokens = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option(flag("model") + "," + flag("model_name_or_path"), a->model, "Model folder or Hugging Face id (local cache only)")->required();
  auto* ids = cmd->add_option(flag("ids"), a->ids, "Comma-separated token ids, e.g. 1,2,3");
  auto* text = cmd->add_option(flag("text"), a->text, "Text to score (tokenized with the model's tokenizer)");
  auto* jsonl = cmd->add_option(flag("jsonl"), a->jsonl, "File of JSON lines {\"ids\": [...]} or {\"text\": ...}");
  ids->excludes(text)->excludes(jsonl);
  text->excludes(jsonl);
  cmd->add_option(flag("dtype"), a->dtype, "Convert the weights: f32 | bf16 (default: the checkpoint's)");
  cmd->add_flag(flag("tokens"), a->show_tokens, "Also print each scored token as text");
  cmd->add_option(flag("revision"), a->revision, "Hub cache revision")->capture_default_str();
  cmd->add_option(flag("batch_size"), a->batch_size, "Sequences per forward pass")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->callback([a] {
    std::optional<Tokenizer> tok;
    auto tokenizer = [&]() -> const Tokenizer& {
      if (!tok) tok = Tokenizer::from_pretrained(a->model, a->revision);
      return *tok;
    };
    std::vector<std::vector<int32_t>> seqs;
    if (!a->ids.empty()) {
      seqs.push_back(parse_ids(a->ids, "--ids"));
    } else if (!a->text.empty()) {
      seqs.push_back(tokenizer().encode(a->text, true));
      if (seqs.back().empty()) fail("--text: the text has no tokens");
    } else if (!a->jsonl.empty()) {
      std::ifstream in(a->jsonl);
      if (!in) fail("{}: cannot open", a->jsonl);
      std::string line;
      for (int64_t n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = fmt::format("{}:{}", a->jsonl, n);
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
          fail("{}: not valid JSON (column {}): {}", where, e.byte, e.what());
        }
        seqs.push_back(ids_from_json(j, where, tokenizer));
      }
      if (seqs.empty()) fail("{}: no input lines", a->jsonl);
    } else {
      fail("give the input with --ids, --text or --jsonl");
    }
    LoadOptions lo;
    lo.revision = a->revision;
    if (!a->dtype.empty()) {
      auto dt = dtype_from_name(a->dtype);
      if (!dt || !dtype_is_float(*dt)) fail("--dtype '{}': expected f32 or bf16", a->dtype);
      lo.dtype = dt;
    }
    CausalLM model = CausalLM::from_pretrained(a->model, lo);
    auto backend = make_cpu_backend();
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

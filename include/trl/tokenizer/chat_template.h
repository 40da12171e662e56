// apply_chat_template, as Transformers does it: render the tokenizer's Jinja chat template with the messages,
// tools, documents, add_generation_prompt, the special tokens and any extra variables (enable_thinking, ...).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/tokenizer/tokenizer.h"

namespace trl {

struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  bool continue_final_message = false;       // cut the text right after the final message's content
  // JSON values keep their key order (ordered_json), as Python dicts do: tojson output depends on it.
  nlohmann::ordered_json tools = nullptr;            // a list of JSON schemas, or null
  nlohmann::ordered_json documents = nullptr;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // template variables (enable_thinking, ...)
  std::optional<std::string> chat_template{};       // overrides the tokenizer's template
};

struct ChatRender {
  std::string text;
  // [begin, end) byte ranges of text produced inside {% generation %} blocks (assistant output).
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

struct ChatEncoding {
  std::vector<int32_t> input_ids;
  // 1 for tokens that overlap a {% generation %} span (TRL's assistant_only_loss), else 0.
  std::vector<int32_t> assistant_masks;
  std::string text;
};

// Renders `messages` (a JSON array of {"role", "content", ...}). Errors (no template, template errors, bad
// options) are trl::Error with the template's line and column.
ChatRender apply_chat_template(const Tokenizer& tokenizer, const nlohmann::ordered_json& messages, const ChatTemplateOptions& options = {});
// The same, tokenized (no special tokens added: the template writes them), with the assistant mask.
ChatEncoding apply_chat_template_ids(const Tokenizer& tokenizer, const nlohmann::ordered_json& messages, const ChatTemplateOptions& options = {});

}  // namespace trl

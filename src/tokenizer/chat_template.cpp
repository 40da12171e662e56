#include "trl/tokenizer/chat_template.h"

#include <map>
#include <memory>
#include <mutex>

#include "trl/core/error.h"
#include "tokenizer/jinja.h"

namespace trl {

namespace {

// Parsed templates are cached by source text: a chat template is parsed once per process.
std::shared_ptr<const jinja::Template> compiled(const std::string& source) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const jinja::Template>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(source);
  if (it != cache.end()) return it->second;
  auto t = std::make_shared<const jinja::Template>(source, "chat template");
  cache.emplace(source, t);
  return t;
}

std::string strip_py(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  if (left)
    while (b < e && ws(s[b])) ++b;
  if (right)
    while (e > b && ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

}  // namespace

ChatRender apply_chat_template(const Tokenizer& tok, const nlohmann::ordered_json& messages, const ChatTemplateOptions& o) {
  const std::string source = o.chat_template ? *o.chat_template : tok.chat_template();
  if (source.empty()) {
    fail("this tokenizer has no chat template (no 'chat_template' in tokenizer_config.json and no chat_template.jinja), so it cannot render "
         "messages: give the data as text (a \"text\" field, or \"prompt\" and \"completion\" strings), or use a model whose tokenizer has a "
         "chat template (an instruct model's tokenizer files)");
  }
  if (!messages.is_array()) fail("apply_chat_template: messages must be a list of {{\"role\": ..., \"content\": ...}} objects");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object() || !messages[i].contains("role")) fail("apply_chat_template: message {} has no 'role'", i);
    if (!messages[i]["role"].is_string())
      fail("apply_chat_template: message {}: 'role' must be text such as \"user\" or \"assistant\", got {}", i, messages[i]["role"].dump());
    // Content is text, a list of parts ({"type": "text", "text": ...}) or null (an assistant turn of tool calls only);
    // anything else would reach the template as a value it cannot render.
    if (const auto c = messages[i].find("content"); c != messages[i].end() && !c->is_string() && !c->is_array() && !c->is_null())
      fail("apply_chat_template: message {} ('{}'): 'content' must be text or a list of parts, got {}", i,
           messages[i]["role"].is_string() ? messages[i]["role"].get<std::string>() : messages[i]["role"].dump(), c->dump());
  }
  if (o.continue_final_message && o.add_generation_prompt) {
    fail("continue_final_message and add_generation_prompt are not compatible: use continue_final_message to continue the last "
         "message, add_generation_prompt to start a new assistant message");
  }
  jinja::Dict ctx;
  ctx.emplace_back("messages", jinja::Value::from_json(messages));
  ctx.emplace_back("tools", jinja::Value::from_json(o.tools));
  ctx.emplace_back("documents", jinja::Value::from_json(o.documents));
  ctx.emplace_back("add_generation_prompt", jinja::Value(o.add_generation_prompt));
  const std::pair<const char*, const std::string*> specials[] = {
      {"bos_token", &tok.bos_token()}, {"eos_token", &tok.eos_token()}, {"pad_token", &tok.pad_token()}, {"unk_token", &tok.unk_token()}};
  for (const auto& [name, value] : specials) {
    if (!value->empty()) ctx.emplace_back(name, jinja::Value(*value));
  }
  if (!o.extra.is_null()) {
    if (!o.extra.is_object()) fail("apply_chat_template: extra template variables must be an object");
    for (auto it = o.extra.begin(); it != o.extra.end(); ++it) {
      bool replaced = false;
      for (auto& kv : ctx)
        if (kv.first == it.key()) kv.second = jinja::Value::from_json(it.value()), replaced = true;
      if (!replaced) ctx.emplace_back(it.key(), jinja::Value::from_json(it.value()));
    }
  }
  jinja::RenderResult r = compiled(source)->render(jinja::Value(std::move(ctx)));
  ChatRender out{std::move(r.text), std::move(r.generation_spans)};
  if (o.continue_final_message) {
    if (messages.empty()) fail("continue_final_message needs at least one message");
    const nlohmann::ordered_json& content = messages.back().value("content", nlohmann::ordered_json());
    std::string final_message;
    if (content.is_string()) {
      final_message = content.get<std::string>();
    } else if (content.is_array()) {
      bool found = false;
      for (auto it = content.rbegin(); it != content.rend() && !found; ++it) {
        if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) final_message = (*it)["text"].get<std::string>(), found = true;
      }
      if (!found) fail("continue_final_message: the final message has no text block to continue");
    } else {
      fail("continue_final_message: the final message has no content");
    }
    const std::string stripped = strip_py(final_message, true, true);
    const size_t loc = out.text.rfind(stripped);
    if (loc == std::string::npos) {
      fail("continue_final_message is set but the final message does not appear in the rendered chat; the template probably "
           "changes the message content");
    }
    const std::string lstripped = strip_py(final_message, true, false);
    if (out.text.compare(loc, lstripped.size(), final_message) == 0) out.text.resize(loc + lstripped.size());
    else out.text.resize(loc + stripped.size());
    for (auto& [b, e] : out.generation_spans) {
      b = std::min(b, out.text.size());
      e = std::min(e, out.text.size());
    }
  }
  return out;
}

ChatEncoding apply_chat_template_ids(const Tokenizer& tok, const nlohmann::ordered_json& messages, const ChatTemplateOptions& o) {
  ChatRender r = apply_chat_template(tok, messages, o);
  ChatEncoding enc;
  std::vector<std::pair<size_t, size_t>> offsets;
  enc.input_ids = tok.encode_with_offsets(r.text, false, offsets);
  enc.assistant_masks.assign(enc.input_ids.size(), 0);
  for (const auto& [b, e] : r.generation_spans) {
    if (b >= e) continue;
    for (size_t i = 0; i < offsets.size(); ++i) {
      if (offsets[i].first < e && offsets[i].second > b) enc.assistant_masks[i] = 1;
    }
  }
  enc.text = std::move(r.text);
  return enc;
}

}  // namespace trl

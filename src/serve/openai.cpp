#include "serve/openai.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "trl/core/error.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl::serve {

namespace {

// ---- fields of the body, each checked for its type and range ----
std::string kind(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

[[noreturn]] void bad(const std::string& field, const std::string& what) { throw ApiError(400, fmt::format("'{}': {}", field, what), field); }

const ojson* field(const ojson& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<bool> get_bool(const ojson& body, const char* name) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(name, "must be true or false, got " + kind(*v));
  return v->get<bool>();
}

std::optional<double> get_number(const ojson& body, const char* name, double lo, double hi) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(name, "must be a number, got " + kind(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) bad(name, fmt::format("must be in [{}, {}], got {}", lo, hi, v->dump()));
  return x;
}

std::optional<int64_t> get_int(const ojson& body, const char* name, int64_t lo, int64_t hi) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() && std::abs(v->get<double>()) < 9e15) {
    const auto x = static_cast<int64_t>(v->get<double>());
    if (x < lo || x > hi) bad(name, fmt::format("must be in [{}, {}], got {}", lo, hi, v->dump()));
    return x;
  }
  if (!v->is_number_integer()) bad(name, "must be an integer, got " + (v->is_number() ? v->dump() : kind(*v)));
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) bad(name, fmt::format("must be in [{}, {}], got {}", lo, hi, v->dump()));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) bad(name, fmt::format("must be in [{}, {}], got {}", lo, hi, v->dump()));
  return x;
}

std::vector<int32_t> token_ids(const ojson& v, const std::string& name, int64_t vocab) {
  std::vector<int32_t> ids;
  for (const auto& x : v) {
    if (!x.is_number_integer()) bad(name, "token ids must be integers, got " + kind(x));
    const int64_t id = x.get<int64_t>();
    if (id < 0 || id >= vocab) bad(name, fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// A message's content as the chat templates read it: a string (OpenAI's list of parts joined: the text parts).
ojson message_content(const ojson& content, const std::string& where) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) bad(where, "must be a string or a list of content parts, got " + kind(content));
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) bad(at, "a content part is {\"type\": \"text\", \"text\": ...}");
    if (part["type"] != "text") bad(at, fmt::format("content parts of type '{}' are not supported (text only)", part["type"].get<std::string>()));
    if (!part.contains("text") || !part["text"].is_string()) bad(at + ".text", "must be a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

ojson read_messages(const ojson& body) {
  const ojson* m = field(body, "messages");
  if (!m) bad("messages", "is required");
  if (!m->is_array() || m->empty()) bad("messages", "must be a non-empty list of {\"role\", \"content\"}");
  ojson out = ojson::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const ojson& msg = (*m)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!msg.is_object()) bad(at, "must be an object with \"role\" and \"content\", got " + kind(msg));
    if (!msg.contains("role") || !msg["role"].is_string()) bad(at + ".role", "is required (a string)");
    ojson copy = msg;
    if (msg.contains("content")) copy["content"] = message_content(msg["content"], at + ".content");
    out.push_back(std::move(copy));
  }
  return out;
}

std::vector<std::string> read_stop(const ojson& body) {
  const ojson* v = field(body, "stop");
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) bad("stop", "must be a string or a list of strings, got " + kind(*v));
  std::vector<std::string> out;
  for (const auto& s : *v) {
    if (!s.is_string()) bad("stop", "must be a string or a list of strings");
    if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

// Sampling: what the request gives, else the model's generation_config.json. temperature 0 is greedy.
void read_sampling(const ojson& body, const ServedModels& served, SamplingParams& p) {
  p = served.defaults;
  if (const auto t = get_number(body, "temperature", 0, 100)) {
    if (*t == 0) p.do_sample = false;
    else p.do_sample = true, p.temperature = static_cast<float>(*t);
  }
  if (const auto v = get_number(body, "top_p", 0, 1)) {
    if (*v == 0) bad("top_p", "must be in (0, 1], got 0");
    p.top_p = static_cast<float>(*v);
  }
  if (const auto v = get_int(body, "top_k", -1, std::numeric_limits<int32_t>::max())) p.top_k = *v < 0 ? 0 : *v;  // -1: off (vLLM)
  if (const auto v = get_number(body, "min_p", 0, 1)) p.min_p = static_cast<float>(*v);
  if (const auto v = get_number(body, "repetition_penalty", 1e-6, 100)) p.repetition_penalty = static_cast<float>(*v);
  for (const char* f : {"presence_penalty", "frequency_penalty"})
    if (const auto v = get_number(body, f, -2, 2); v && *v != 0)
      bad(f, "is not supported (only 0); use repetition_penalty, which Transformers' generate() has");
  if (const ojson* lb = field(body, "logit_bias"); lb && !(lb->is_object() && lb->empty())) bad("logit_bias", "is not supported");
  if (const ojson* rf = field(body, "response_format"); rf && !(rf->is_object() && rf->value("type", "") == "text"))
    bad("response_format", "only {\"type\": \"text\"} is supported");
}

}  // namespace

std::string error_body(const ApiError& e) {
  ojson j = {{"error", {{"message", e.what()}, {"type", e.type}, {"param", e.param.empty() ? ojson(nullptr) : ojson(e.param)}, {"code", e.status}}}};
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

ApiRequest parse_request(const std::string& text, bool chat, const ServedModels& served) {
  ojson body;
  try {
    body = ojson::parse(text);
  } catch (const std::exception&) {
    throw ApiError(400, "the body is not valid JSON (expected a JSON object)");
  }
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object, got " + kind(body));
  const Tokenizer& tok = *served.tokenizer;
  const int64_t vocab = served.vocab_size > 0 ? served.vocab_size : tok.vocab_size();
  ApiRequest r;
  r.chat = chat;

  // ---- which model ----
  if (const ojson* m = field(body, "model")) {
    if (!m->is_string()) bad("model", "must be a string, got " + kind(*m));
    const std::string name = m->get<std::string>();
    const auto it = std::find(served.names.begin(), served.names.end(), name);
    if (it == served.names.end()) {
      std::string known;
      for (const auto& n : served.names) known += (known.empty() ? "" : ", ") + n;
      throw ApiError(404, fmt::format("The model '{}' does not exist: this server has {}", name, known), "model", "not_found_error");
    }
    r.model = static_cast<size_t>(it - served.names.begin());
  }
  r.model_name = served.names.at(r.model);

  // ---- the prompts ----
  if (chat) {
    ChatTemplateOptions o;
    o.add_generation_prompt = get_bool(body, "add_generation_prompt").value_or(true);
    o.continue_final_message = get_bool(body, "continue_final_message").value_or(false);
    if (o.continue_final_message && o.add_generation_prompt && field(body, "add_generation_prompt"))
      bad("continue_final_message", "cannot be used with add_generation_prompt true");
    if (o.continue_final_message) o.add_generation_prompt = false;
    if (const ojson* t = field(body, "tools")) {
      if (!t->is_array()) bad("tools", "must be a list of tools, got " + kind(*t));
      if (!t->empty()) o.tools = *t;
    }
    if (const ojson* k = field(body, "chat_template_kwargs")) {
      if (!k->is_object()) bad("chat_template_kwargs", "must be an object, got " + kind(*k));
      o.extra = *k;
    }
    const ojson messages = read_messages(body);
    try {
      r.prompts.push_back(apply_chat_template_ids(tok, messages, o).input_ids);
    } catch (const Error& e) {
      bad("messages", std::string("the chat template failed: ") + e.what());
    }
  } else {
    const ojson* p = field(body, "prompt");
    if (!p) bad("prompt", "is required");
    auto add_text = [&](const ojson& s) {
      r.prompt_texts.push_back(s.get<std::string>());
      r.prompts.push_back(tok.encode(s.get<std::string>(), true));
    };
    if (p->is_string()) {
      add_text(*p);
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
      r.prompts.push_back(token_ids(*p, "prompt", vocab));
    } else if (p->is_array() && !p->empty()) {
      for (const auto& item : *p) {
        if (item.is_string()) add_text(item);
        else if (item.is_array()) r.prompts.push_back(token_ids(item, "prompt", vocab));
        else bad("prompt", "a list of prompts holds strings or lists of token ids, got " + kind(item));
      }
    } else {
      bad("prompt", "must be a string, a list of strings, a list of token ids or a list of such lists");
    }
    if (r.prompt_texts.size() != r.prompts.size()) {  // token-id prompts: echo decodes them
      r.prompt_texts.clear();
      for (const auto& ids : r.prompts) r.prompt_texts.push_back(tok.decode(ids, false));
    }
    if (const auto s = field(body, "suffix"); s) bad("suffix", "is not supported");
    r.echo = get_bool(body, "echo").value_or(false);
  }
  for (size_t i = 0; i < r.prompts.size(); ++i)
    if (r.prompts[i].empty()) bad(chat ? "messages" : "prompt", r.prompts.size() > 1 ? fmt::format("prompt {} has no tokens", i) : "the prompt has no tokens");

  // ---- lengths, choices, streaming ----
  const int64_t max_len = served.max_model_len;
  if (const auto v = get_int(body, "max_completion_tokens", 1, max_len)) r.max_tokens = v;
  else if (const auto w = get_int(body, "max_tokens", 1, max_len)) r.max_tokens = w;
  r.n = get_int(body, "n", 1, served.max_n).value_or(1);
  if (const auto b = get_int(body, "best_of", 1, served.max_n); b && *b != r.n) bad("best_of", "is not supported (only best_of = n)");
  r.stream = get_bool(body, "stream").value_or(false);
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "must be an object, got " + kind(*so));
    if (!r.stream) bad("stream_options", "is only allowed with stream true");
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  r.return_token_ids = get_bool(body, "return_token_ids").value_or(false);
  if (const auto seed = get_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    r.seed = static_cast<uint64_t>(*seed);

  // ---- log-probs: chat's logprobs (bool) + top_logprobs (0..20); completions' logprobs (0..20) ----
  if (chat) {
    const bool lp = get_bool(body, "logprobs").value_or(false);
    const auto top = get_int(body, "top_logprobs", 0, 20);
    if (top && !lp) bad("top_logprobs", "needs logprobs true");
    if (lp) r.logprobs = top.value_or(0);
  } else if (const auto lp = get_int(body, "logprobs", 0, 20)) {
    r.logprobs = *lp;
  }

  // ---- what every choice asks of the batcher ----
  SequenceRequest& s = r.sequence;
  read_sampling(body, served, s.sampling);
  s.stop = read_stop(body);
  s.eos_token_ids = get_bool(body, "ignore_eos").value_or(false) ? std::vector<int32_t>{} : served.eos_token_ids;
  if (const ojson* st = field(body, "stop_token_ids")) {
    if (!st->is_array()) bad("stop_token_ids", "must be a list of token ids, got " + kind(*st));
    for (int32_t id : token_ids(*st, "stop_token_ids", vocab)) s.eos_token_ids.push_back(id);
  }
  s.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);
  s.logprobs = r.logprobs;
  s.model = r.model;
  return r;
}

namespace {

ojson token_entry(const Tokenizer& tok, const TokenLogprob& t) {
  const std::string text = tok.decode(std::vector<int32_t>{t.id}, false);
  ojson bytes = ojson::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return ojson{{"token", text}, {"logprob", t.logprob}, {"bytes", bytes}};
}

// Chat: {"content": [{token, logprob, bytes, top_logprobs}]}.
ojson chat_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lp, const std::vector<std::vector<TokenLogprob>>& top) {
  ojson content = ojson::array();
  for (size_t i = 0; i < lp.size(); ++i) {
    ojson e = token_entry(tok, lp[i]);
    ojson t = ojson::array();
    if (i < top.size())
      for (const auto& x : top[i]) t.push_back(token_entry(tok, x));
    e["top_logprobs"] = t;
    content.push_back(e);
  }
  return ojson{{"content", content}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
ojson completion_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lp, const std::vector<std::vector<TokenLogprob>>& top, size_t offset) {
  ojson tokens = ojson::array(), values = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (size_t i = 0; i < lp.size(); ++i) {
    const std::string text = tok.decode(std::vector<int32_t>{lp[i].id}, false);
    tokens.push_back(text);
    values.push_back(lp[i].logprob);
    offsets.push_back(offset);
    offset += text.size();
    ojson t = ojson::object();
    if (i < top.size())
      for (const auto& x : top[i]) t[tok.decode(std::vector<int32_t>{x.id}, false)] = x.logprob;
    tops.push_back(t);
  }
  return ojson{{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

ojson finish_value(const std::string& reason) { return reason.empty() ? ojson(nullptr) : ojson(reason == "abort" ? "abort" : reason); }

}  // namespace

ojson response_json(const ApiRequest& r, const std::string& id, int64_t created, const std::vector<ChoiceResult>& choices, const Usage& usage,
                    const Tokenizer& tok) {
  ojson out = {{"id", id}, {"object", r.chat ? "chat.completion" : "text_completion"}, {"created", created}, {"model", r.model_name}};
  ojson cs = ojson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    ojson choice = {{"index", i}};
    if (r.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      choice["logprobs"] = r.logprobs >= 0 ? chat_logprobs(tok, c.logprobs, c.top_logprobs) : ojson(nullptr);
    } else {
      const std::string prefix = r.echo ? r.prompt_texts.at(static_cast<size_t>(c.prompt_index)) : "";
      choice["text"] = prefix + c.text;
      choice["logprobs"] = r.logprobs >= 0 ? completion_logprobs(tok, c.logprobs, c.top_logprobs, prefix.size()) : ojson(nullptr);
    }
    choice["finish_reason"] = finish_value(c.finish_reason);
    if (r.return_token_ids) {
      choice["token_ids"] = c.ids;
      choice["prompt_token_ids"] = r.prompts.at(static_cast<size_t>(c.prompt_index));
    }
    cs.push_back(std::move(choice));
  }
  out["choices"] = std::move(cs);
  out["usage"] = {{"prompt_tokens", usage.prompt_tokens}, {"completion_tokens", usage.completion_tokens},
                  {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  return out;
}

ojson chunk_json(const ApiRequest& r, const std::string& id, int64_t created, int64_t index, const SequenceDelta& d, bool first, const Tokenizer& tok) {
  ojson out = {{"id", id}, {"object", r.chat ? "chat.completion.chunk" : "text_completion"}, {"created", created}, {"model", r.model_name}};
  ojson choice = {{"index", index}};
  if (r.chat) {
    ojson delta = ojson::object();
    if (first) delta["role"] = "assistant";
    if (!d.text.empty() || first) delta["content"] = d.text;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = r.logprobs >= 0 && !d.logprobs.empty() ? chat_logprobs(tok, d.logprobs, d.top_logprobs) : ojson(nullptr);
  } else {
    choice["text"] = d.text;
    choice["logprobs"] = r.logprobs >= 0 && !d.logprobs.empty() ? completion_logprobs(tok, d.logprobs, d.top_logprobs, 0) : ojson(nullptr);
  }
  choice["finish_reason"] = d.finished ? finish_value(d.finish_reason) : ojson(nullptr);
  if (r.return_token_ids) choice["token_ids"] = d.ids;
  out["choices"] = ojson::array({std::move(choice)});
  if (r.include_usage) out["usage"] = nullptr;
  return out;
}

ojson usage_chunk_json(const ApiRequest& r, const std::string& id, int64_t created, const Usage& usage) {
  return ojson{{"id", id},
               {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
               {"created", created},
               {"model", r.model_name},
               {"choices", ojson::array()},
               {"usage", {{"prompt_tokens", usage.prompt_tokens}, {"completion_tokens", usage.completion_tokens},
                          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}}}};
}

}  // namespace trl::serve

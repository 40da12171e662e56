// `trl tokenize`: text -> ids (or ids -> text with --decode), plain or JSON lines, optionally through the chat template.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "core/json_text.h"
#include "cli/options.h"
#include "trl/core/error.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl::cli {

namespace {

std::vector<int32_t> ids_from_text(const std::string& text) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    if (cur.find_first_not_of("0123456789") != std::string::npos || cur.size() > 9) fail("'{}' is not a token id", cur);
    ids.push_back(static_cast<int32_t>(std::stol(cur)));
    cur.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '[' || c == ']') flush();
    else cur += c;
  }
  flush();
  return ids;
}

ChatTemplateOptions chat_options_from(const nlohmann::ordered_json& line, const std::string& where) {
  ChatTemplateOptions o;
  for (auto it = line.begin(); it != line.end(); ++it) {
    const std::string& k = it.key();
    if (k == "messages") continue;
    if (k == "tools") o.tools = it.value();
    else if (k == "documents") o.documents = it.value();
    else if (k == "add_generation_prompt") {
      if (!it.value().is_boolean()) fail("{}: add_generation_prompt must be true or false", where);
      o.add_generation_prompt = it.value().get<bool>();
    } else if (k == "continue_final_message") {
      if (!it.value().is_boolean()) fail("{}: continue_final_message must be true or false", where);
      o.continue_final_message = it.value().get<bool>();
    } else if (k == "chat_template") {
      if (!it.value().is_string()) fail("{}: chat_template must be the template's text", where);
      o.chat_template = it.value().get<std::string>();
    } else {
      o.extra[k] = it.value();
    }
  }
  return o;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto* cmd = add_command(app, "tokenize", "Text on stdin -> token ids (--decode: ids -> text); --jsonl for JSON lines, --chat for conversations");
  struct Args {
    std::string model, revision = "main";
    bool decode = false, jsonl = false, chat = false, skip_special_tokens = false, add_special_tokens = true;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  opts.add("model,model_name_or_path", a->model, "Model folder or Hugging Face id (local cache only)").required();
  opts.add("revision", a->revision, "Hub cache revision");
  opts.add("decode", a->decode, "Read ids, print text");
  opts.add("jsonl", a->jsonl, "Read JSON lines ({\"text\": ...}, {\"ids\": [...]} with --decode, {\"messages\": [...]} with --chat)");
  opts.add("chat", a->chat, "Apply the chat template to {\"messages\": [...], ...} lines (other keys go to the template)");
  opts.add("skip_special_tokens", a->skip_special_tokens, "With --decode: drop special tokens");
  opts.add("add_special_tokens", a->add_special_tokens, "Add the post-processor's special tokens (BOS/EOS)");
  on_run(cmd, [a] {
    if (a->chat && !a->jsonl) usage_fail("--chat reads JSON lines: add --jsonl");
    if (a->chat && a->decode) usage_fail("--chat and --decode cannot be combined");
    Tokenizer tok = Tokenizer::from_pretrained(a->model, a->revision);
    if (!a->jsonl) {
      const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
      if (a->decode) {
        const std::string text = tok.decode(ids_from_text(input), a->skip_special_tokens);
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::printf("\n");
      } else {
        const auto ids = tok.encode(input, a->add_special_tokens);
        std::string out;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (i) out += ',';
          out += std::to_string(ids[i]);
        }
        std::printf("%s\n", out.c_str());
      }
      return;
    }
    std::string line;
    for (int64_t n = 1; std::getline(std::cin, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = fmt::format("stdin:{}", n);
      const nlohmann::ordered_json j = parse_json<nlohmann::ordered_json>(line, where);
      if (!j.is_object()) fail("{}: expected a JSON object", where);
      nlohmann::ordered_json out;
      if (a->decode) {
        if (!j.contains("ids") || !j["ids"].is_array()) fail("{}: missing the \"ids\" array", where);
        out["text"] = tok.decode(token_ids_from_json(j["ids"], where), a->skip_special_tokens);
      } else if (a->chat) {
        if (!j.contains("messages")) fail("{}: missing \"messages\"", where);
        const ChatEncoding enc = [&] {
          try {
            return apply_chat_template_ids(tok, j["messages"], chat_options_from(j, where));
          } catch (const Error& e) {  // the template's and the messages' errors, with the line they come from
            const std::string message = e.what();
            if (message.rfind(where, 0) == 0) throw;
            fail("{}: {}", where, message);
          }
        }();
        out["ids"] = enc.input_ids;
        out["text"] = enc.text;
        if (std::find(enc.assistant_masks.begin(), enc.assistant_masks.end(), 1) != enc.assistant_masks.end()) {
          out["assistant_masks"] = enc.assistant_masks;
        }
      } else {
        if (!j.contains("text") || !j["text"].is_string()) fail("{}: missing the \"text\" string", where);
        out["ids"] = tok.encode(j["text"].get<std::string>(), a->add_special_tokens);
      }
      const std::string s = out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
      std::printf("%s\n", s.c_str());
    }
  });
}

}  // namespace trl::cli

// `trl generate` and `trl chat`: text generation on the static-cache engine (src/generation), streaming tokens as
// they come. Sampling flags mirror GenerationConfig; unset ones come from the model's generation_config.json.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "core/error.h"
#include "core/fs.h"
#include "generation/generate.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace trl::cli {

namespace {

using ojson = nlohmann::ordered_json;

// The flags shared by generate and chat.
struct GenFlags {
  std::string model, dtype, revision = "main", enable_thinking;
  std::optional<int64_t> max_new_tokens, top_k, pad_to_multiple_of;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<uint64_t> seed;
  std::optional<bool> do_sample;
  std::vector<int32_t> eos_token_id;
  std::optional<int32_t> pad_token_id;
  std::vector<std::string> stop;
  std::string cache_implementation = "static";
  bool disable_compile = false, verbose = false;
};

void add_gen_flags(CLI::App* cmd, GenFlags& f) {
  cmd->add_option(flag("model") + "," + flag("model_name_or_path"), f.model, "Model folder or Hugging Face id (local cache only)")->required();
  cmd->add_option(flag("dtype"), f.dtype, "Convert the weights: f32 | bf16 (default: the checkpoint's)");
  cmd->add_option(flag("revision"), f.revision, "Hub cache revision")->capture_default_str();
  cmd->add_option(flag("max_new_tokens"), f.max_new_tokens, "Tokens to generate (default: the model's generation config, else max_length 20)")
      ->check(CLI::PositiveNumber);
  cmd->add_option(flag("do_sample"), f.do_sample, "true | false (default: the model's generation config, else greedy)");
  cmd->add_option(flag("temperature"), f.temperature, "Softmax temperature when sampling");
  cmd->add_option(flag("top_k"), f.top_k, "Keep the k most likely tokens (0 = off)");
  cmd->add_option(flag("top_p"), f.top_p, "Nucleus sampling mass (1 = off)");
  cmd->add_option(flag("min_p"), f.min_p, "Drop tokens below min_p x the top probability");
  cmd->add_option(flag("repetition_penalty"), f.repetition_penalty, "Penalty for tokens already in the sequence (1 = off)");
  cmd->add_option(flag("seed"), f.seed, "Sampling seed (same seed, same output)");
  cmd->add_option(flag("eos_token_id"), f.eos_token_id, "End-of-sequence id(s) (default: the model's)");
  cmd->add_option(flag("pad_token_id"), f.pad_token_id, "Padding id (default: the model's, else the first eos)");
  cmd->add_option(flag("stop") + "," + flag("stop_strings"), f.stop, "Stop when this text is generated (repeatable)");
  cmd->add_option(flag("pad_to_multiple_of"), f.pad_to_multiple_of, "Prompt/cache bucket (default: the backend's auto, 64 on CPU; 0 = none)");
  cmd->add_option(flag("cache_implementation"), f.cache_implementation, "static | dynamic")
      ->check(CLI::IsMember({"static", "dynamic"}))
      ->capture_default_str();
  cmd->add_flag(flag("disable_compile"), f.disable_compile, "Run on the reference backend (the slow oracle)");
  cmd->add_option(flag("enable_thinking"), f.enable_thinking, "Chat template variable for Qwen3: true | false")->check(CLI::IsMember({"true", "false"}));
  cmd->add_flag(flag("verbose"), f.verbose, "Print program counters and speed to stderr");
}

GenerationConfig to_config(const GenFlags& f) {
  GenerationConfig c;
  c.max_new_tokens = f.max_new_tokens;
  c.do_sample = f.do_sample;
  c.temperature = f.temperature;
  c.top_k = f.top_k;
  c.top_p = f.top_p;
  c.min_p = f.min_p;
  c.repetition_penalty = f.repetition_penalty;
  c.seed = f.seed;
  if (!f.eos_token_id.empty()) c.eos_token_id = f.eos_token_id;
  c.pad_token_id = f.pad_token_id;
  c.stop_strings = f.stop;
  c.cache_implementation = f.cache_implementation;
  c.disable_compile = f.disable_compile;
  c.pad_to_multiple_of = f.pad_to_multiple_of;
  return c;
}

CausalLM load_model(const GenFlags& f) {
  LoadOptions lo;
  lo.revision = f.revision;
  if (!f.dtype.empty()) {
    auto dt = dtype_from_name(f.dtype);
    if (!dt || !dtype_is_float(*dt)) fail("--dtype '{}': expected f32 or bf16", f.dtype);
    lo.dtype = dt;
  }
  return CausalLM::from_pretrained(f.model, lo);
}

ChatTemplateOptions chat_options(const GenFlags& f) {
  ChatTemplateOptions o;
  o.add_generation_prompt = true;
  if (!f.enable_thinking.empty()) o.extra["enable_thinking"] = f.enable_thinking == "true";
  return o;
}

// Prints a row's text as tokens arrive: decodes everything so far and writes the new part, holding back a
// trailing incomplete UTF-8 sequence (shown as U+FFFD until its last byte arrives).
struct TextStreamer {
  const Tokenizer& tok;
  std::vector<int32_t> ids;
  size_t printed = 0;
  std::string text;
  void put(int32_t id) {
    ids.push_back(id);
    text = tok.decode(ids, true);
    size_t end = text.size();
    if (end >= 3 && text.compare(end - 3, 3, "\xEF\xBF\xBD") == 0) end -= 3;  // wait for the rest of the character
    if (end > printed) {
      std::fwrite(text.data() + printed, 1, end - printed, stdout);
      std::fflush(stdout);
      printed = end;
    }
  }
  void finish() {
    if (text.size() > printed) std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
    std::fflush(stdout);
  }
};

void report(const GenFlags& f, const Generator& gen, const GenerationOutput& out, double seconds) {
  if (!f.verbose) return;
  int64_t tokens = 0;
  for (const auto& g : out.generated) tokens += static_cast<int64_t>(g.size());
  std::fprintf(stderr, "[trl] %lld rows, prompt bucket %lld, cache length %lld, %lld new tokens in %.2f s (%.1f tokens/s); programs compiled %lld, cache hits %lld\n",
               static_cast<long long>(out.generated.size()), static_cast<long long>(out.prompt_length), static_cast<long long>(out.cache_length),
               static_cast<long long>(tokens), seconds, static_cast<double>(tokens) / seconds, static_cast<long long>(gen.stats().compilations),
               static_cast<long long>(gen.stats().hits));
}

}  // namespace

void register_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt (streamed), or from a JSON-lines file of prompts");
  struct Args : GenFlags {
    std::string prompt, input, output;
    bool chat = false;
    int64_t num_return_sequences = 1, batch_size = 8;
  };
  auto a = std::make_shared<Args>();
  add_gen_flags(cmd, *a);
  auto* prompt = cmd->add_option(flag("prompt"), a->prompt, "The prompt text");
  auto* input = cmd->add_option(flag("input"), a->input, "JSON lines: {\"prompt\": text} or {\"messages\": [...]} or {\"ids\": [...]}");
  prompt->excludes(input);
  cmd->add_option(flag("output"), a->output, "With --input: where to write one JSON line per completion (default: stdout)");
  cmd->add_flag(flag("chat"), a->chat, "Apply the model's chat template to --prompt (a user message)");
  cmd->add_option(flag("num_return_sequences"), a->num_return_sequences, "Completions per prompt")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option(flag("batch_size"), a->batch_size, "With --input: prompts per generate() call")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->callback([a] {
    if (a->prompt.empty() && a->input.empty()) fail("give a prompt with --prompt or a file with --input");
    const Tokenizer tok = Tokenizer::from_pretrained(a->model, a->revision);
    const CausalLM model = load_model(*a);
    Generator gen(model);
    GenerationConfig cfg = to_config(*a);
    cfg.num_return_sequences = a->num_return_sequences;
    if (!a->prompt.empty()) {
      std::vector<int32_t> ids;
      if (a->chat) {
        ojson messages = ojson::array({ojson{{"role", "user"}, {"content", a->prompt}}});
        ids = apply_chat_template_ids(tok, messages, chat_options(*a)).input_ids;
      } else {
        ids = tok.encode(a->prompt, true);
      }
      if (ids.empty()) fail("--prompt: the prompt has no tokens");
      std::vector<TextStreamer> streams(static_cast<size_t>(a->num_return_sequences), TextStreamer{tok, {}, 0, {}});
      if (a->num_return_sequences == 1) cfg.streamer = [&](int64_t, int32_t id) { streams[0].put(id); };
      const auto t0 = std::chrono::steady_clock::now();
      const GenerationOutput out = gen.generate({ids}, cfg, &tok);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (a->num_return_sequences == 1) {
        streams[0].finish();
        std::printf("\n");
      } else {
        for (size_t r = 0; r < out.generated.size(); ++r) std::printf("--- %zu\n%s\n", r, tok.decode(out.generated[r], true).c_str());
      }
      report(*a, gen, out, secs);
      return;
    }
    // Batches from a file.
    std::ifstream in(a->input);
    if (!in) fail("{}: cannot open", a->input);
    struct Item {
      std::vector<int32_t> ids;
      ojson source;
    };
    std::vector<Item> items;
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = fmt::format("{}:{}", a->input, n);
      ojson j;
      try {
        j = ojson::parse(line);
      } catch (const ojson::parse_error& e) {
        fail("{}: not valid JSON: {}", where, e.what());
      }
      Item it;
      it.source = j;
      if (j.is_object() && j.contains("messages")) {
        if (!j["messages"].is_array()) fail("{}: \"messages\" must be a list of {{role, content}}", where);
        it.ids = apply_chat_template_ids(tok, j["messages"], chat_options(*a)).input_ids;
      } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
        it.ids = a->chat ? apply_chat_template_ids(tok, ojson::array({ojson{{"role", "user"}, {"content", j["prompt"]}}}), chat_options(*a)).input_ids
                         : tok.encode(j["prompt"].get<std::string>(), true);
      } else if (j.is_object() && j.contains("ids") && j["ids"].is_array()) {
        for (const auto& x : j["ids"]) {
          if (!x.is_number_integer()) fail("{}: \"ids\" must hold integers", where);
          it.ids.push_back(x.get<int32_t>());
        }
      } else {
        fail("{}: expected {{\"prompt\": text}}, {{\"messages\": [...]}} or {{\"ids\": [...]}}", where);
      }
      if (it.ids.empty()) fail("{}: the prompt has no tokens", where);
      items.push_back(std::move(it));
    }
    if (items.empty()) fail("{}: no prompts", a->input);
    std::string result;
    const auto t0 = std::chrono::steady_clock::now();
    GenerationOutput last;
    for (size_t i = 0; i < items.size(); i += static_cast<size_t>(a->batch_size)) {
      std::vector<std::vector<int32_t>> prompts;
      for (size_t k = i; k < std::min(items.size(), i + static_cast<size_t>(a->batch_size)); ++k) prompts.push_back(items[k].ids);
      last = gen.generate(prompts, cfg, &tok);
      for (size_t r = 0; r < last.generated.size(); ++r) {
        const Item& it = items[i + r / static_cast<size_t>(a->num_return_sequences)];
        ojson o = it.source;
        o["completion"] = tok.decode(last.generated[r], true);
        o["completion_ids"] = last.generated[r];
        o["finish_reason"] = last.finish_reasons[r];
        result += o.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n";
      }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (a->output.empty()) std::fwrite(result.data(), 1, result.size(), stdout);
    else write_text_file_atomic(a->output, result);
    report(*a, gen, last, secs);
  });

  auto* chat = app.add_subcommand("chat", "Chat with a model in the terminal (/clear, /system TEXT, /exit)");
  struct ChatArgs : GenFlags {
    std::string system;
  };
  auto c = std::make_shared<ChatArgs>();
  add_gen_flags(chat, *c);
  chat->add_option(flag("system") + "," + flag("system_prompt"), c->system, "A system message to start with");
  chat->callback([c] {
    const Tokenizer tok = Tokenizer::from_pretrained(c->model, c->revision);
    const CausalLM model = load_model(*c);
    Generator gen(model);
    GenerationConfig cfg = to_config(*c);
    std::string system = c->system;
    ojson history = ojson::array();
    const bool tty = isatty(0);
    std::fprintf(stderr, "trl chat: %s. Commands: /clear (forget the conversation), /system TEXT (set the system message), /exit\n",
                 c->model.c_str());
    std::string line;
    int64_t turn = 0;
    while (true) {
      if (tty) std::fprintf(stderr, ">>> ");
      if (!std::getline(std::cin, line)) break;
      if (line.empty()) continue;
      if (line == "/exit" || line == "/quit") break;
      if (line == "/clear") {
        history = ojson::array();
        std::fprintf(stderr, "[conversation cleared]\n");
        continue;
      }
      if (line.rfind("/system", 0) == 0) {
        system = line.size() > 8 ? line.substr(8) : "";
        history = ojson::array();
        std::fprintf(stderr, "[system message set; conversation cleared]\n");
        continue;
      }
      if (line[0] == '/') {
        std::fprintf(stderr, "[unknown command %s: /clear, /system TEXT, /exit]\n", line.c_str());
        continue;
      }
      history.push_back(ojson{{"role", "user"}, {"content", line}});
      ojson messages = ojson::array();
      if (!system.empty()) messages.push_back(ojson{{"role", "system"}, {"content", system}});
      for (const auto& m : history) messages.push_back(m);
      const std::vector<int32_t> ids = apply_chat_template_ids(tok, messages, chat_options(*c)).input_ids;
      TextStreamer stream{tok, {}, 0, {}};
      cfg.streamer = [&](int64_t, int32_t id) { stream.put(id); };
      if (!c->seed) cfg.seed = static_cast<uint64_t>(turn);  // a new draw each turn, reproducible per conversation
      const auto t0 = std::chrono::steady_clock::now();
      const GenerationOutput out = gen.generate({ids}, cfg, &tok);
      stream.finish();
      std::printf("\n");
      report(*c, gen, out, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      history.push_back(ojson{{"role", "assistant"}, {"content", tok.decode(out.generated[0], true)}});
      ++turn;
    }
  });
}

}  // namespace trl::cli

// `trl generate` and `trl chat`: text generation on the static-cache engine (src/generation), streaming tokens as
// they come. Sampling flags mirror GenerationConfig; unset ones come from the model's generation_config.json.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <csignal>
#include <random>
#include <atomic>

#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "core/json_text.h"
#include "cli/options.h"
#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/generation/generate.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl::cli {

namespace {

using ojson = nlohmann::ordered_json;

// The flags shared by generate and chat.
struct GenFlags {
  std::string model, adapter, dtype, revision = "main";
  std::optional<bool> enable_thinking, do_sample;
  std::optional<int64_t> max_new_tokens, top_k, pad_to_multiple_of;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<uint64_t> seed;
  std::vector<int32_t> eos_token_id;
  std::optional<int32_t> pad_token_id;
  std::vector<std::string> stop;
  std::string cache_implementation = "static";
  std::string device = "auto";
  bool disable_compile = false, verbose = false;
};

// `transformers chat` and this CLI answer up to 256 new tokens when the model's generation_config.json names no length
// (Transformers' library default, max_length 20 with the prompt included, ends a chat on its second turn).
constexpr int64_t kDefaultNewTokens = 256;

void add_gen_flags(Options& o, GenFlags& f, bool model_required = true) {
  const std::string gc = "generation_config.json's";
  Opt model = o.add("model,model_name_or_path", f.model, "Model folder, Hugging Face id (local cache only) or PEFT adapter folder");
  if (model_required) model.required();
  o.add("adapter", f.adapter, "A PEFT LoRA adapter folder to apply to --model (merged into the weights once)");
  o.add("dtype,torch_dtype", f.dtype, "Convert the weights").choices({"f32", "float32", "bf16", "bfloat16"}).default_text("the checkpoint's");
  o.add("revision", f.revision, "Hub cache revision");
  o.add("device", f.device, "auto | cpu | cuda: the backend the compiled programs run on (one that is not here is an error)");
  o.add("max_new_tokens", f.max_new_tokens, "Tokens to generate").min(1).default_text(gc + " max_new_tokens (or max_length), else 256");
  o.add("do_sample", f.do_sample, "Sample (true) or greedy (false)").default_text(gc + ", else false");
  o.add("temperature", f.temperature, "Softmax temperature when sampling").above(0).default_text(gc + ", else 1.0");
  o.add("top_k", f.top_k, "Keep the k most likely tokens (0 = off)").min(0).default_text(gc + ", else 50");
  o.add("top_p", f.top_p, "Nucleus sampling mass (1 = off)").above(0).max(1).default_text(gc + ", else 1.0");
  o.add("min_p", f.min_p, "Drop tokens below min_p x the top probability").min(0).max(1).default_text(gc + ", else off");
  o.add("repetition_penalty", f.repetition_penalty, "Penalty for tokens already in the sequence (1 = off)").above(0).default_text(gc + ", else 1.0");
  o.add("seed", f.seed, "Sampling seed (same seed, same output)").default_text("a fresh one each run (printed with --verbose)");
  o.add("eos_token_id", f.eos_token_id, "End-of-sequence id(s)").min(0).default_text(gc + ", else the model's");
  o.add("pad_token_id", f.pad_token_id, "Padding id").min(0).default_text(gc + ", else the first eos");
  o.add("stop,stop_strings", f.stop, "Stop when this text is generated (several allowed)");
  o.add("pad_to_multiple_of", f.pad_to_multiple_of, "Prompt/cache bucket (0 = none)").min(0).default_text("the backend's auto, 64 on the CPU");
  o.add("cache_implementation", f.cache_implementation, "KV cache").choices({"static", "dynamic"});
  o.add("disable_compile", f.disable_compile, "Run on the reference backend (the slow oracle)");
  o.add("enable_thinking", f.enable_thinking, "Chat template variable for Qwen3 (thinking on or off)").default_text("None (the template's)");
  o.add("verbose", f.verbose, "Print program counters, speed and the seed to stderr");
}

GenerationConfig to_config(const GenFlags& f, const Generator& gen) {
  GenerationConfig c;
  c.max_new_tokens = f.max_new_tokens;
  if (!c.max_new_tokens && !gen.defaults().max_new_tokens && !gen.defaults().max_length) c.max_new_tokens = kDefaultNewTokens;
  c.do_sample = f.do_sample;
  c.temperature = f.temperature;
  c.top_k = f.top_k;
  c.top_p = f.top_p;
  c.min_p = f.min_p;
  c.repetition_penalty = f.repetition_penalty;
  // As in Transformers, sampling without a seed differs from run to run.
  c.seed = f.seed ? *f.seed : std::random_device{}() * 0x100000000ull + std::random_device{}();
  if (f.verbose && !f.seed && f.do_sample.value_or(gen.defaults().do_sample.value_or(false)))
    std::fprintf(stderr, "[trl] sampling seed %llu (pass --seed to repeat this run)\n", static_cast<unsigned long long>(*c.seed));
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
  lo.device = f.device;
  if (!f.dtype.empty()) lo.dtype = (f.dtype == "bf16" || f.dtype == "bfloat16") ? DType::BF16 : DType::F32;
  return load_inference_model(f.model, f.adapter, lo, /*merge=*/true);
}

ChatTemplateOptions chat_options(const GenFlags& f) {
  ChatTemplateOptions o;
  o.add_generation_prompt = true;
  if (f.enable_thinking) o.extra["enable_thinking"] = *f.enable_thinking;
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

// The prompt ids of one --input line: {"prompt": text} (the chat template with --chat), {"messages": [...]} or
// {"ids": [...]}.
std::vector<int32_t> prompt_ids(const Tokenizer& tok, const ojson& j, bool chat, const ChatTemplateOptions& opts, const std::string& where) {
  if (j.is_object() && j.contains("messages")) {
    if (!j["messages"].is_array()) fail("{}: \"messages\" must be a list of {{role, content}}", where);
    return apply_chat_template_ids(tok, j["messages"], opts).input_ids;
  }
  if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
    return chat ? apply_chat_template_ids(tok, ojson::array({ojson{{"role", "user"}, {"content", j["prompt"]}}}), opts).input_ids
                : tok.encode(j["prompt"].get<std::string>(), true);
  }
  if (j.is_object() && j.contains("ids")) return token_ids_from_json(j["ids"], where + ": \"ids\"");
  fail("{}: expected {{\"prompt\": text}}, {{\"messages\": [...]}} or {{\"ids\": [...]}}", where);
}

struct ChatArgs : GenFlags {
  std::string system, url, api_key;
};

// Ctrl-C while an answer streams stops that answer; the chat goes on (at the prompt, Ctrl-C ends it as usual).
std::atomic<bool> g_stop_answer{false};
extern "C" void stop_answer(int) { g_stop_answer = true; }

// One answer of `trl chat`, streamed; false (with the error on stderr) when generation failed.
bool chat_turn(const ChatArgs& c, const Tokenizer& tok, Generator& gen, GenerationConfig& cfg, const ojson& messages, std::string& answer) {
  TextStreamer stream{tok, {}, 0, {}};
  cfg.streamer = [&](int64_t, int32_t id) { stream.put(id); };
  g_stop_answer = false;
  cfg.interrupted = [] { return g_stop_answer.load(); };
  struct sigaction on{}, old{};
  on.sa_handler = stop_answer;
  sigemptyset(&on.sa_mask);
  sigaction(SIGINT, &on, &old);
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  try {
    const std::vector<int32_t> ids = apply_chat_template_ids(tok, messages, chat_options(c)).input_ids;
    const GenerationOutput out = gen.generate({ids}, cfg, &tok);
    stream.finish();
    std::printf("\n");
    if (out.finish_reasons[0] == "interrupted") std::fprintf(stderr, "[answer stopped]\n");
    report(c, gen, out, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    answer = tok.decode(out.generated[0], true);
  } catch (const std::exception& e) {
    stream.finish();
    std::fflush(stdout);
    std::fprintf(stderr, "\n[error: %s]\n[the question was not added to the conversation; /clear starts a new one]\n", e.what());
    ok = false;
  }
  sigaction(SIGINT, &old, nullptr);
  return ok;
}

void run_chat_loop(const ChatArgs& c, const std::function<bool(const ojson&, uint64_t, std::string&)>& answer_turn);

// One answer from a running `trl serve` (or any OpenAI-compatible server), streamed: POST /v1/chat/completions with
// "stream": true, the text of each server-sent event's delta printed as it arrives.
bool remote_chat_turn(const ChatArgs& c, uint64_t seed, const ojson& messages, std::string& answer) {
  ojson body = {{"messages", messages}, {"stream", true}};
  if (!c.model.empty()) body["model"] = c.model;
  if (c.max_new_tokens) body["max_tokens"] = *c.max_new_tokens;
  if (c.do_sample && !*c.do_sample) body["temperature"] = 0;
  else if (c.temperature) body["temperature"] = *c.temperature;
  if (c.top_p) body["top_p"] = *c.top_p;
  if (c.top_k) body["top_k"] = *c.top_k;
  if (c.min_p) body["min_p"] = *c.min_p;
  if (c.repetition_penalty) body["repetition_penalty"] = *c.repetition_penalty;
  if (!c.stop.empty()) body["stop"] = c.stop;
  body["seed"] = seed;
  if (c.enable_thinking) body["chat_template_kwargs"] = {{"enable_thinking", *c.enable_thinking}};
  std::string base = c.url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  std::string prefix;  // the URL's path: "/v1" unless it names one
  if (const size_t scheme = base.find("://"); scheme != std::string::npos) {
    if (const size_t path = base.find('/', scheme + 3); path != std::string::npos) prefix = base.substr(path), base.resize(path);
  }
  if (prefix.empty()) prefix = "/v1";
  httplib::Client client(base);
  if (!client.is_valid()) fail("--url {}: not an http:// address", c.url);
  client.set_read_timeout(600, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = prefix + "/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!c.api_key.empty()) req.set_header("Authorization", "Bearer " + c.api_key);
  std::string pending, error_body;
  int status = 0;
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, n);
      return true;
    }
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
      const std::string event = pending.substr(0, end);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const ojson chunk = ojson::parse(event.substr(6), nullptr, false);
      if (chunk.is_discarded() || !chunk.contains("choices") || chunk["choices"].empty()) continue;
      const ojson& delta = chunk["choices"][0].value("delta", ojson::object());
      if (delta.contains("content") && delta["content"].is_string()) {
        const std::string piece = delta["content"].get<std::string>();
        answer += piece;
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
    }
    return !g_stop_answer.load();
  };
  g_stop_answer = false;
  struct sigaction on{}, old{};
  on.sa_handler = stop_answer;
  sigemptyset(&on.sa_mask);
  sigaction(SIGINT, &on, &old);
  const httplib::Result res = client.send(req);
  sigaction(SIGINT, &old, nullptr);
  std::printf("\n");
  if (g_stop_answer) {
    std::fprintf(stderr, "[answer stopped]\n");
    return true;
  }
  if (!res) {
    const bool refused = res.error() == httplib::Error::Connection;
    std::fprintf(stderr, "[error: no answer from %s: %s]\n", c.url.c_str(),
                 refused ? "could not connect (is `trl serve` running there?)" : ("the connection failed (" + httplib::to_string(res.error()) + ")").c_str());
    return false;
  }
  if (status != 200) {
    const ojson e = ojson::parse(error_body, nullptr, false);
    const std::string msg = !e.is_discarded() && e.contains("error") && e["error"].is_object() ? e["error"].value("message", error_body) : error_body;
    std::fprintf(stderr, "[error: the server answered %d: %s]\n", status, msg.c_str());
    return false;
  }
  return true;
}

void run_chat(const ChatArgs& c) {
  if (!c.url.empty()) {  // a running server answers; nothing is loaded here
    const uint64_t seed = c.seed ? *c.seed : std::random_device{}();
    run_chat_loop(c, [&](const ojson& messages, uint64_t turn, std::string& answer) { return remote_chat_turn(c, seed + turn, messages, answer); });
    return;
  }
  if (c.model.empty()) usage_fail("chat: give --model, or --url of a running server (trl serve)");
  const Tokenizer tok = Tokenizer::from_pretrained(tokenizer_source(c.model), c.revision);
  const CausalLM model = load_model(c);
  Generator gen(model);
  GenerationConfig cfg = to_config(c, gen);
  const uint64_t seed = *cfg.seed;
  run_chat_loop(c, [&](const ojson& messages, uint64_t turn, std::string& answer) {
    cfg.seed = seed + turn;  // a new draw each turn, reproducible per conversation with --seed
    return chat_turn(c, tok, gen, cfg, messages, answer);
  });
}

// The terminal conversation: commands, history, and one answer per line typed.
void run_chat_loop(const ChatArgs& c, const std::function<bool(const ojson&, uint64_t, std::string&)>& answer_turn) {
  std::string system = c.system;
  ojson history = ojson::array();
  const bool tty = isatty(0);
  std::fprintf(stderr, "trl chat: %s. Commands: /clear (forget the conversation), /system TEXT (set the system message), /exit; Ctrl-C stops an answer\n",
               c.url.empty() ? c.model.c_str() : (c.url + (c.model.empty() ? "" : " (" + c.model + ")")).c_str());
  std::string line;
  for (uint64_t turn = 0;;) {
    if (tty) std::fprintf(stderr, ">>> ");
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
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
    ojson messages = ojson::array();
    if (!system.empty()) messages.push_back(ojson{{"role", "system"}, {"content", system}});
    for (const auto& m : history) messages.push_back(m);
    messages.push_back(ojson{{"role", "user"}, {"content", line}});
    std::string answer;
    if (!answer_turn(messages, turn++, answer)) continue;
    history.push_back(ojson{{"role", "user"}, {"content", line}});
    history.push_back(ojson{{"role", "assistant"}, {"content", answer}});
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto* cmd = add_command(app, "generate", "Generate text from a prompt (streamed), or from a JSON-lines file of prompts");
  struct Args : GenFlags {
    std::string prompt, input, output;
    bool chat = false;
    int64_t num_return_sequences = 1, batch_size = 8;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  add_gen_flags(opts, *a);
  Opt prompt = opts.add("prompt", a->prompt, "The prompt text");
  Opt input = opts.add("input", a->input, "JSON lines: {\"prompt\": text} or {\"messages\": [...]} or {\"ids\": [...]}");
  prompt.excludes(input);
  opts.add("output", a->output, "With --input: where to write one JSON line per completion").default_text("stdout");
  opts.add("chat", a->chat, "Apply the model's chat template to --prompt (a user message)");
  opts.add("num_return_sequences", a->num_return_sequences, "Completions per prompt").min(1);
  opts.add("batch_size", a->batch_size, "With --input: prompts per generate() call").min(1);
  on_run(cmd, [a] {
    if (a->prompt.empty() && a->input.empty()) fail("give a prompt with --prompt or a file with --input");
    const Tokenizer tok = Tokenizer::from_pretrained(tokenizer_source(a->model), a->revision);
    const CausalLM model = load_model(*a);
    Generator gen(model);
    GenerationConfig cfg = to_config(*a, gen);
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
      int64_t line = 0;  // in --input
    };
    const int64_t vocab = model.config().vocab_size;
    std::vector<Item> items;
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = fmt::format("{}:{}", a->input, n);
      ojson j = parse_json<ojson>(line, where);
      Item it;
      it.source = j;
      try {
        it.ids = prompt_ids(tok, j, a->chat, chat_options(*a), where);
      } catch (const Error& e) {
        const std::string what = e.what();
        if (what.rfind(where, 0) == 0) throw;
        fail("{}: {}", where, what);
      }
      if (it.ids.empty()) fail("{}: the prompt has no tokens", where);
      for (int32_t id : it.ids)
        if (id < 0 || id >= vocab) fail("{}: token id {} is outside the model's vocabulary [0, {})", where, id, vocab);
      it.line = n;
      items.push_back(std::move(it));
    }
    if (items.empty()) fail("{}: no prompts", a->input);
    std::string result;
    const auto t0 = std::chrono::steady_clock::now();
    GenerationOutput last;
    for (size_t i = 0; i < items.size(); i += static_cast<size_t>(a->batch_size)) {
      std::vector<std::vector<int32_t>> prompts;
      const size_t end = std::min(items.size(), i + static_cast<size_t>(a->batch_size));
      size_t longest = i;
      for (size_t k = i; k < end; ++k) {
        prompts.push_back(items[k].ids);
        if (items[k].ids.size() > items[longest].ids.size()) longest = k;
      }
      try {
        last = gen.generate(prompts, cfg, &tok);
      } catch (const Error& e) {  // name the lines, not the places in the batch (the longest prompt sets the shapes)
        fail("{}: lines {} to {} (--batch_size {}; the longest prompt, {} tokens, is line {}): {}", a->input, items[i].line,
             items[end - 1].line, a->batch_size, items[longest].ids.size(), items[longest].line, e.what());
      }
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

  auto* chat = add_command(app, "chat", "Chat with a model in the terminal (/clear, /system TEXT, /exit; Ctrl-C stops an answer)");
  auto c = std::make_shared<ChatArgs>();
  Options chat_opts(chat);
  add_gen_flags(chat_opts, *c, /*model_required=*/false);
  chat_opts.add("system,system_prompt", c->system, "A system message to start with");
  chat_opts.add("url", c->url, "Talk to a running server (trl serve, or any OpenAI-compatible one) at this address, e.g. http://127.0.0.1:8000 (--model then names the served model)");
  chat_opts.add("api_key", c->api_key, "With --url: the server's API key").default_text("none");
  on_run(chat, [c] { run_chat(*c); });
}

}  // namespace trl::cli

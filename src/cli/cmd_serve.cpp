// `trl serve`: an OpenAI-compatible server (docs/SERVE.md) over the continuous-batching engine
// (trl/generation/continuous.h), as `transformers serve`, `vllm serve` and llama-server are started.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include <signal.h>

#include <fmt/format.h>

#include "cli/cli_util.h"
#include "cli/options.h"
#include "serve/server.h"
#include "trl/core/error.h"
#include "trl/generation/generate.h"
#include "trl/models/lora.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl::cli {

namespace {

struct ServeArgs {
  std::string model, dtype, revision = "main", device = "auto", served_model_name;
  std::vector<std::string> adapters;  // NAME=DIR
  std::string host = "127.0.0.1", api_key;
  int port = 8000;
  int64_t max_batch = 8, max_model_len = 0, max_queue = 64, prefill_chunk = 0, max_n = 16, max_request_bytes = 8 << 20;
  bool verbose = false;
};

std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int sig) { g_signal = sig; }

// The sampling defaults of a request that names none: the model's generation_config.json, else Transformers'.
SamplingParams model_defaults(const std::string& dir) {
  const GenerationConfig g = GenerationConfig::from_model_dir(dir);
  SamplingParams p;
  p.do_sample = g.do_sample.value_or(false);
  p.temperature = g.temperature.value_or(1.0f);
  p.top_k = g.top_k.value_or(50);
  p.top_p = g.top_p.value_or(1.0f);
  p.min_p = g.min_p;
  p.repetition_penalty = g.repetition_penalty.value_or(1.0f);
  return p;
}

void run_serve(const ServeArgs& a) {
  // ---- listen first: /health answers 503 while the model loads ----
  serve::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.max_request_bytes = a.max_request_bytes;
  so.threads = static_cast<int>(std::min<int64_t>(a.max_batch + a.max_queue + 8, 1024));
  so.verbose = a.verbose;
  serve::Server server(so);
  server.start();
  struct sigaction on{}, old_term{}, old_int{};
  on.sa_handler = on_stop_signal;
  sigemptyset(&on.sa_mask);
  sigaction(SIGTERM, &on, &old_term);
  sigaction(SIGINT, &on, &old_int);
  std::fprintf(stderr, "trl serve: listening on http://%s:%d (loading %s)\n", a.host.c_str(), server.port(), a.model.c_str());

  // ---- the model, its adapters (sharing its weights) and the tokenizer ----
  LoadOptions lo;
  lo.revision = a.revision;
  lo.device = a.device;
  if (!a.dtype.empty()) lo.dtype = (a.dtype == "bf16" || a.dtype == "bfloat16") ? DType::BF16 : DType::F32;
  const Tokenizer tok = Tokenizer::from_pretrained(tokenizer_source(a.model), a.revision);
  const CausalLM base = load_inference_model(a.model, "", lo, /*merge=*/true);
  std::vector<CausalLM> adapted;
  serve::ServedModels served;
  served.names.push_back(a.served_model_name.empty() ? a.model : a.served_model_name);
  for (const std::string& spec : a.adapters) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) fail("--adapter {}: expected NAME=DIR (the name clients send as \"model\")", spec);
    const std::string name = spec.substr(0, eq), dir = spec.substr(eq + 1);
    if (std::find(served.names.begin(), served.names.end(), name) != served.names.end()) fail("--adapter {}: the name '{}' is taken", spec, name);
    if (!is_adapter_dir(dir)) fail("--adapter {}: {} is not a PEFT adapter folder (no adapter_config.json)", spec, dir);
    adapted.push_back(base.with_adapter(load_adapter(dir, base.config())));
    served.names.push_back(name);
  }
  std::vector<const CausalLM*> models{&base};
  for (const auto& m : adapted) models.push_back(&m);

  ContinuousBatcher::Options bo;
  bo.max_batch = a.max_batch;
  bo.max_model_len = a.max_model_len;
  bo.max_queue = a.max_queue;
  bo.prefill_chunk = a.prefill_chunk;
  if (a.verbose) bo.log = [](const std::string& line) { std::fprintf(stderr, "[trl serve] %s\n", line.c_str()); };
  ContinuousBatcher batcher(models, tok, bo);

  served.tokenizer = &tok;
  served.defaults = model_defaults(base.path());
  const GenerationConfig g = GenerationConfig::from_model_dir(base.path());
  if (g.eos_token_id) served.eos_token_ids = *g.eos_token_id;
  else if (tok.eos_token_id()) served.eos_token_ids = {*tok.eos_token_id()};
  served.max_n = a.max_n;
  served.max_model_len = batcher.max_model_len();
  served.vocab_size = base.config().vocab_size;
  const ModelConfig& mc = base.config();
  const int64_t cache_bytes = 2 * mc.num_hidden_layers * (batcher.max_batch() + 1) * batcher.max_model_len() * mc.num_key_value_heads * mc.head_dim *
                              static_cast<int64_t>(dtype_size(base.dtype()));
  server.ready(batcher, served);
  const std::string adapters = served.names.size() > 1 ? fmt::format(" and {} adapter(s)", served.names.size() - 1) : "";
  fmt::print(stderr, "trl serve: ready: http://{}:{}/v1 serves {}{} ({}, max_batch {}, max_model_len {}, KV cache {:.2f} GiB); Ctrl-C or SIGTERM drains and stops\n",
             a.host, server.port(), served.names[0], adapters, dtype_name(base.dtype()), batcher.max_batch(), batcher.max_model_len(),
             static_cast<double>(cache_bytes) / (1 << 30));

  // ---- until SIGTERM or Ctrl-C: then the running requests finish and the server closes ----
  while (g_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::fprintf(stderr, "trl serve: %s: finishing the running requests, then stopping\n", g_signal.load() == SIGTERM ? "SIGTERM" : "interrupted");
  server.stop(/*drain=*/true);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  std::fprintf(stderr, "trl serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto* cmd = add_command(app, "serve", "Serve a model over the OpenAI API (chat and text completions, streaming), with continuous batching");
  auto a = std::make_shared<ServeArgs>();
  Options o(cmd);
  o.add("model,model_name_or_path", a->model, "Model folder, Hugging Face id (local cache only) or PEFT adapter folder (merged)").required();
  o.add("adapter", a->adapters, "NAME=DIR: a PEFT LoRA adapter served as model NAME beside the base (several allowed; they share the base weights)");
  o.add("served_model_name", a->served_model_name, "The base model's name in requests and /v1/models").default_text("--model as given");
  o.add("dtype,torch_dtype", a->dtype, "Convert the weights").choices({"f32", "float32", "bf16", "bfloat16"}).default_text("the checkpoint's");
  o.add("revision", a->revision, "Hub cache revision");
  o.add("device", a->device, "auto | cpu | cuda: the backend the programs run on");
  o.add("host", a->host, "Address to listen on (0.0.0.0: every interface)");
  o.add("port", a->port, "Port to listen on (0: any free port, printed)").min(0).max(65535);
  o.add("api_key", a->api_key, "Require \"Authorization: Bearer KEY\" on every endpoint but /health").default_text("none");
  o.add("max_batch,max_num_seqs", a->max_batch, "Sequences generated together (rows of the KV cache)").min(1).max(1024);
  o.add("max_model_len", a->max_model_len, "Tokens per sequence, prompt and completion (KV cache slots per row)").min(0).default_text("min(2048, max_position_embeddings)");
  o.add("max_queue", a->max_queue, "Sequences that may wait for a row; beyond them requests get 429").min(0);
  o.add("prefill_chunk", a->prefill_chunk, "Prompt tokens prefilled per sequence and step").min(0).default_text("the backend's pad_to_multiple_of, 64 on the CPU");
  o.add("max_n", a->max_n, "Most choices (n) per request").min(1).max(1024);
  o.add("max_request_bytes", a->max_request_bytes, "Largest request body (413 beyond)").min(1024);
  o.add("verbose", a->verbose, "A line per request and per compiled program on stderr");
  on_run(cmd, [a] { run_serve(*a); });
}

}  // namespace trl::cli

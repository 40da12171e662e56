#include "serve/server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "trl/core/error.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl::serve {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kHeartbeat = std::chrono::milliseconds(500);  // how often a waiting response checks that its client is there

// One request's sequences and what the batcher's thread has sent them, read by the HTTP thread that answers it.
struct Exchange {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int64_t, SequenceDelta>> events;  // (choice, delta), in order
  std::vector<ChoiceResult> results;
  std::vector<std::shared_ptr<ContinuousBatcher::Ticket>> tickets;
  int64_t unfinished = 0;
  bool stream = false;  // the deltas are kept for the stream; a whole answer needs only the results
  Usage usage;
  void cancel() {
    for (auto& t : tickets)
      if (t) t->cancel();
  }
  void take(int64_t choice, const SequenceDelta& d);
};

int64_t unix_time() { return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string request_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  return fmt::format("{}-{:016x}{:08x}", prefix, salt, counter.fetch_add(1) & 0xffffffffu);
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(error_body(e), "application/json");
}

}  // namespace

struct Server::Impl {
  ServerOptions opt;
  httplib::Server http;
  std::thread listener;
  std::atomic<ContinuousBatcher*> batcher{nullptr};
  ServedModels served;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> requests{0}, rejected_full{0}, rejected_bad{0}, disconnects{0};
  std::mutex stop_mu;
  std::condition_variable stopped_cv;
  bool stopped = false;

  bool authorized(const httplib::Request& req) const {
    if (opt.api_key.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    const std::string want = "Bearer " + opt.api_key;
    if (h.size() != want.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < h.size(); ++i) diff |= static_cast<unsigned char>(h[i] ^ want[i]);
    return diff == 0;
  }

  void routes();
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  std::string metrics_text() const;
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>()) { impl_->opt = std::move(options); }

Server::~Server() {
  if (impl_->listener.joinable()) stop(false);
}

int Server::port() const { return impl_->opt.port; }

void Server::start() {
  Impl& s = *impl_;
  s.routes();
  const int threads = s.opt.threads > 0 ? s.opt.threads : 64;
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.http.set_payload_max_length(static_cast<size_t>(s.opt.max_request_bytes));
  s.http.set_read_timeout(10, 0);  // a client that sends part of a request and stalls (slowloris) is dropped
  s.http.set_write_timeout(10, 0);
  s.http.set_keep_alive_timeout(5);
  if (s.opt.port == 0) {
    const int port = s.http.bind_to_any_port(s.opt.host);
    if (port <= 0) fail("trl serve: cannot listen on {} (any port)", s.opt.host);
    s.opt.port = port;
  } else if (!s.http.bind_to_port(s.opt.host, s.opt.port)) {
    fail("trl serve: cannot listen on {}:{} (the port is taken, or the address is not this machine's); choose another with --port",
         s.opt.host, s.opt.port);
  }
  s.listener = std::thread([&s] {
    s.http.listen_after_bind();
    std::lock_guard<std::mutex> lock(s.stop_mu);
    s.stopped = true;
    s.stopped_cv.notify_all();
  });
}

void Server::ready(ContinuousBatcher& batcher, ServedModels served) {
  impl_->served = std::move(served);
  impl_->batcher.store(&batcher);
}

void Server::stop(bool drain) {
  Impl& s = *impl_;
  s.draining = true;
  if (ContinuousBatcher* b = s.batcher.load()) b->shutdown(drain);  // the running sequences finish (or abort)
  // Their answers are written (a client that stopped reading is given up after a minute).
  for (int i = 0; drain && s.in_flight.load() > 0 && i < 3000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // httplib's stop() acts only on a server that is listening: the listener thread may not have got there yet (a model
  // that fails to load at once), so stop until it has stopped.
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(s.stop_mu);
      if (s.stopped || !s.listener.joinable()) break;
    }
    if (s.http.is_running()) s.http.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (s.listener.joinable()) s.listener.join();
}

void Server::wait() {
  std::unique_lock<std::mutex> lock(impl_->stop_mu);
  impl_->stopped_cv.wait(lock, [&] { return impl_->stopped; });
}

void Server::Impl::routes() {
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "trl serve: " + what));
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) send_error(res, ApiError(404, fmt::format("no endpoint {} {} (POST /v1/chat/completions, POST /v1/completions, GET /v1/models, /health, /metrics)", req.method, req.path)));
    else if (res.status == 413) send_error(res, ApiError(413, "the request body is too large (--max_request_bytes)"));
    else if (res.status == 400) send_error(res, ApiError(400, "the HTTP request is malformed"));
    else send_error(res, ApiError(res.status, fmt::format("HTTP status {}", res.status)));
  });
  if (opt.verbose)
    http.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      std::fprintf(stderr, "[trl serve] %s %s -> %d\n", req.method.c_str(), req.path.c_str(), res.status);
    });
  // Authentication and loading come before any route.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (!authorized(req)) {
      send_error(res, ApiError(401, "a valid API key is required: send \"Authorization: Bearer KEY\" with the server's --api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (batcher.load() == nullptr) send_error(res, ApiError(503, "the model is loading"));
    else if (draining) send_error(res, ApiError(503, "the server is shutting down"));
    else res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    if (batcher.load() == nullptr) return send_error(res, ApiError(503, "the model is loading"));
    nlohmann::ordered_json data = nlohmann::ordered_json::array();
    for (size_t i = 0; i < served.names.size(); ++i)
      data.push_back({{"id", served.names[i]}, {"object", "model"}, {"created", unix_time()}, {"owned_by", "trl.cpp"},
                      {"root", served.names[0]}, {"parent", i == 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(served.names[0])},
                      {"max_model_len", served.max_model_len}});
    res.set_content(nlohmann::ordered_json{{"object", "list"}, {"data", data}}.dump(), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { res.set_content(metrics_text(), "text/plain; version=0.0.4"); });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, true); });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, false); });
}

namespace {

// ---- a completion request's phases ----

// Each prompt's room in a row (max_tokens, or unset all the room there is), and the request's sequences within what
// the server holds at once.
void check_fits(const ApiRequest& r, const ContinuousBatcher& b) {
  const char* field = r.chat ? "messages" : "prompt";
  for (const auto& prompt : r.prompts) {
    const int64_t L = static_cast<int64_t>(prompt.size()), room = b.room_after(L);
    if (room < 1) throw ApiError(400, fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens", b.max_model_len(), L), field);
    if (r.max_tokens && *r.max_tokens > room)
      throw ApiError(400, fmt::format("'max_tokens': {} new tokens after a prompt of {} tokens are more than the maximum context length ({} tokens) allows: at most {}",
                                      *r.max_tokens, L, b.max_model_len(), room), "max_tokens");
  }
  const int64_t sequences = static_cast<int64_t>(r.prompts.size()) * r.n;
  if (sequences > b.capacity())
    throw ApiError(400, fmt::format("{} sequences ({} prompts x n = {}) are more than this server runs and queues at once ({}: --max_batch + --max_queue)",
                                    sequences, r.prompts.size(), r.n, b.capacity()), r.n > 1 ? "n" : field);
}

// What a step added to choice c, recorded for the answer (and for the stream).
void Exchange::take(int64_t c, const SequenceDelta& d) {
  std::lock_guard<std::mutex> lock(mu);
  ChoiceResult& cr = results[static_cast<size_t>(c)];
  cr.ids.insert(cr.ids.end(), d.ids.begin(), d.ids.end());
  cr.text += d.text;
  cr.logprobs.insert(cr.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
  cr.top_logprobs.insert(cr.top_logprobs.end(), d.top_logprobs.begin(), d.top_logprobs.end());
  if (d.finished) {
    cr.finish_reason = d.finish_reason;
    usage.completion_tokens += d.completion_tokens;
    --unfinished;
  }
  if (stream) events.emplace_back(c, d);
  cv.notify_all();
}

// Every choice (prompts × n) to the batcher, seeded seed + choice index. ApiError 429 when the server is full (what
// was submitted is cancelled), 400 when the batcher refuses a field.
std::shared_ptr<Exchange> submit_choices(const ApiRequest& r, ContinuousBatcher& b, bool draining) {
  auto ex = std::make_shared<Exchange>();
  const int64_t choices = static_cast<int64_t>(r.prompts.size()) * r.n;
  ex->results.resize(static_cast<size_t>(choices));
  ex->stream = r.stream;
  ex->unfinished = choices;
  for (const auto& p : r.prompts) ex->usage.prompt_tokens += static_cast<int64_t>(p.size()) * r.n;
  const uint64_t seed = r.seed ? *r.seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  for (int64_t c = 0; c < choices; ++c) {
    const size_t p = static_cast<size_t>(c / r.n);
    ex->results[static_cast<size_t>(c)].prompt_index = static_cast<int64_t>(p);
    SequenceRequest s = r.sequence;
    s.prompt = r.prompts[p];
    s.max_new_tokens = r.max_tokens ? *r.max_tokens : b.room_after(static_cast<int64_t>(s.prompt.size()));
    s.seed = seed + static_cast<uint64_t>(c);
    std::shared_ptr<ContinuousBatcher::Ticket> t;
    try {
      t = b.submit(std::move(s), [ex, c](const SequenceDelta& d) { ex->take(c, d); });
    } catch (const Error& e) {
      ex->cancel();
      throw ApiError(400, e.what());
    }
    if (!t) {
      ex->cancel();
      throw ApiError(draining ? 503 : 429, draining ? "the server is shutting down" : "the server is busy: every slot and the queue are full; retry later");
    }
    ex->tickets.push_back(t);
  }
  return ex;
}

// Server-sent events: each step's chunks as they come, an SSE comment as heartbeat while none do, then the usage
// chunk (when asked) and [DONE].
httplib::ContentProviderWithoutLength stream_answer(std::shared_ptr<Exchange> ex, const ApiRequest& r, const std::string& id, int64_t created,
                                                    const Tokenizer& tok) {
  auto first = std::make_shared<std::vector<char>>(ex->results.size(), 1);
  return [ex, r, id, created, first, &tok](size_t, httplib::DataSink& sink) {
    std::unique_lock<std::mutex> lock(ex->mu);
    if (!ex->cv.wait_for(lock, kHeartbeat, [&] { return !ex->events.empty() || ex->unfinished == 0; })) {
      lock.unlock();
      return sink.write(": keep-alive\n\n", 14);
    }
    auto events = std::move(ex->events);
    ex->events.clear();
    const bool done = ex->unfinished == 0;
    const Usage usage = ex->usage;
    lock.unlock();
    std::string out;
    for (auto& [c, d] : events) {
      const bool is_first = (*first)[static_cast<size_t>(c)];
      if (!is_first && d.text.empty() && d.ids.empty() && !d.finished) continue;
      (*first)[static_cast<size_t>(c)] = 0;
      out += "data: " + chunk_json(r, id, created, c, d, is_first, tok).dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
    }
    if (done) {
      if (r.include_usage) out += "data: " + usage_chunk_json(r, id, created, usage).dump() + "\n\n";
      out += "data: [DONE]\n\n";
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) return false;
    if (done) sink.done();
    return true;
  };
}

// One JSON body once every choice is done, JSON's leading whitespace as heartbeat until then.
httplib::ContentProviderWithoutLength whole_answer(std::shared_ptr<Exchange> ex, const ApiRequest& r, const std::string& id, int64_t created,
                                                   const Tokenizer& tok) {
  return [ex, r, id, created, &tok](size_t, httplib::DataSink& sink) {
    std::unique_lock<std::mutex> lock(ex->mu);
    if (!ex->cv.wait_for(lock, kHeartbeat, [&] { return ex->unfinished == 0; })) {
      lock.unlock();
      return sink.write(" ", 1);
    }
    const std::string body = response_json(r, id, created, ex->results, ex->usage, tok).dump(-1, ' ', false, ojson::error_handler_t::replace);
    lock.unlock();
    if (!sink.write(body.data(), body.size())) return false;
    sink.done();
    return true;
  };
}

}  // namespace

void Server::Impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  ++requests;
  ContinuousBatcher* b = batcher.load();
  if (b == nullptr) return send_error(res, ApiError(503, "the model is loading"));
  if (draining) return send_error(res, ApiError(503, "the server is shutting down"));
  ApiRequest r;
  std::shared_ptr<Exchange> ex;
  try {
    r = parse_request(req.body, chat, served);
    check_fits(r, *b);
    ex = submit_choices(r, *b, draining);
  } catch (const ApiError& e) {
    ++(e.status == 429 || e.status == 503 ? rejected_full : rejected_bad);
    return send_error(res, e);
  }
  // The answer waits in a content provider that writes a heartbeat while nothing is ready, so a client that went
  // away is noticed (the write fails) and its sequences are cancelled.
  ++in_flight;
  auto releaser = [this, ex](bool success) {
    if (!success) {
      ex->cancel();
      ++disconnects;
    }
    --in_flight;
  };
  const std::string id = request_id(chat ? "chatcmpl" : "cmpl");
  if (r.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", stream_answer(ex, r, id, unix_time(), *served.tokenizer), releaser);
  } else {
    res.set_chunked_content_provider("application/json", whole_answer(ex, r, id, unix_time(), *served.tokenizer), releaser);
  }
}

std::string Server::Impl::metrics_text() const {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  metric("trl_http_requests_total", "counter", "Completion requests received", static_cast<double>(requests.load()));
  metric("trl_http_requests_rejected_busy_total", "counter", "Requests answered 429 (every slot and the queue full)", static_cast<double>(rejected_full.load()));
  metric("trl_http_requests_invalid_total", "counter", "Requests answered 400/404 (a bad field)", static_cast<double>(rejected_bad.load()));
  metric("trl_http_client_disconnects_total", "counter", "Responses whose client went away (their sequences cancelled)", static_cast<double>(disconnects.load()));
  ContinuousBatcher* b = batcher.load();
  if (b == nullptr) return out;
  const ContinuousBatcher::Metrics m = b->metrics();
  metric("trl_sequences_total", "counter", "Sequences submitted (a request with n choices is n)", static_cast<double>(m.sequences));
  metric("trl_sequences_finished_total", "counter", "Sequences finished", static_cast<double>(m.finished));
  metric("trl_prompt_tokens_total", "counter", "Prompt tokens prefilled", static_cast<double>(m.prompt_tokens));
  metric("trl_generation_tokens_total", "counter", "Tokens generated", static_cast<double>(m.generated_tokens));
  metric("trl_sequences_running", "gauge", "Sequences holding a row of the KV cache", static_cast<double>(m.running));
  metric("trl_sequences_waiting", "gauge", "Sequences queued for a row", static_cast<double>(m.waiting));
  metric("trl_batch_rows", "gauge", "Rows of the KV cache (--max_batch)", static_cast<double>(m.max_batch));
  metric("trl_batch_occupancy", "gauge", "Decoded rows per row of the decode programs run (1 = no padding rows)",
         m.decode_slots > 0 ? static_cast<double>(m.decode_rows) / static_cast<double>(m.decode_slots) : 0.0);
  metric("trl_decode_steps_total", "counter", "Decode steps", static_cast<double>(m.decode_steps));
  metric("trl_prefill_steps_total", "counter", "Prefill chunk steps", static_cast<double>(m.prefill_steps));
  out += fmt::format("# HELP trl_time_to_first_token_seconds Time from a sequence's submission to its first token\n"
                     "# TYPE trl_time_to_first_token_seconds summary\ntrl_time_to_first_token_seconds_sum {}\ntrl_time_to_first_token_seconds_count {}\n",
                     m.first_token_seconds, m.first_tokens);
  metric("trl_generation_tokens_per_second", "gauge", "Tokens generated per second of work (busy time)",
         m.busy_seconds > 0 ? static_cast<double>(m.generated_tokens) / m.busy_seconds : 0.0);
  metric("trl_programs_compiled", "gauge", "Programs compiled (one per model, batch bucket and step kind)", static_cast<double>(m.programs.size()));
  return out;
}

}  // namespace trl::serve

#include "trl/generation/continuous.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/clock.h"
#include "core/rng.h"
#include "trl/backend/program_cache.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/runtime/shapes.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl {

namespace {

using Clock = std::chrono::steady_clock;

// ---- a sequence's text: whole UTF-8 characters, held back while it may be the start of a stop string ----
// Incremental detokenization: the ids after `prefix_` are decoded, and the text beyond what the ids up to `read_`
// gave is new (a byte-level vocabulary decodes a suffix of the ids to a suffix of the bytes). A decode that ends in
// U+FFFD waits for the token that completes the character.
class TextStream {
 public:
  TextStream(const Tokenizer& tok, const std::vector<std::string>& stop, bool skip_special)
      : tok_(tok), stop_(stop), skip_(skip_special) {
    for (const auto& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
  }
  // After the ids grew: appends their new text. Returns true when a stop string ended the text.
  bool update(const std::vector<int32_t>& ids, size_t counted) {
    const std::span<const int32_t> all(ids.data(), counted);
    const std::string before = tok_.decode(all.subspan(prefix_, read_ - prefix_), skip_);
    const std::string now = tok_.decode(all.subspan(prefix_), skip_);
    if (now.size() > before.size() && !ends_incomplete(now)) {
      text_ += now.substr(before.size());
      prefix_ = read_;
      read_ = counted;
    }
    for (const std::string& s : stop_) {
      if (s.empty()) continue;
      const size_t at = text_.find(s, sent_);
      if (at != std::string::npos) {
        text_.resize(at);
        return true;
      }
    }
    return false;
  }
  // The text that can be sent now (all of it when the sequence finished).
  std::string take(bool finished) {
    size_t upto = text_.size();
    if (!finished && longest_stop_ > 1) upto = upto >= longest_stop_ - 1 ? upto - (longest_stop_ - 1) : 0;
    while (upto > sent_ && upto < text_.size() && (static_cast<unsigned char>(text_[upto]) & 0xC0) == 0x80) --upto;  // a character boundary
    if (upto <= sent_) return {};
    std::string out = text_.substr(sent_, upto - sent_);
    sent_ = upto;
    return out;
  }

 private:
  static bool ends_incomplete(const std::string& s) { return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0; }
  const Tokenizer& tok_;
  std::vector<std::string> stop_;
  bool skip_;
  size_t longest_stop_ = 0, prefix_ = 0, read_ = 0, sent_ = 0;
  std::string text_;
};

// log-softmax of one row of logits: the chosen id's value and, with k > 0, the k most likely.
void row_logprobs(const float* row, int64_t V, int32_t chosen, int64_t k, TokenLogprob& out, std::vector<TokenLogprob>& top) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, row[i]);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
  const double lse = mx + std::log(sum);
  out = {chosen, static_cast<float>(row[chosen] - lse)};
  if (k <= 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const int64_t kk = std::min(k, V);
  std::partial_sort(ids.begin(), ids.begin() + kk, ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  for (int64_t i = 0; i < kk; ++i) top.push_back({ids[static_cast<size_t>(i)], static_cast<float>(row[ids[static_cast<size_t>(i)]] - lse)});
}

int64_t bucket_of(int64_t n, int64_t max) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return std::min(b, max);
}

}  // namespace

// ---- one sequence in a row of the cache ----
// Slots of its row: the prompt is right-aligned to whole chunks ([first, chunks·C), the slots before `first` are
// padding that no query sees), then one slot per new token. A token's position id is its slot - first.
struct Sequence {
  SequenceRequest req;
  ContinuousBatcher::Sink sink;
  std::shared_ptr<std::atomic<bool>> cancelled;
  Clock::time_point submitted;
  int64_t row = -1, first = 0, chunks = 0, next_chunk = 0;
  int64_t slot = 0;       // decode: the slot the pending token is written to
  int32_t pending = 0;    // decode: the token fed at the next step
  bool decoding = false;
  bool done = false;      // finished: its sink has heard the last delta (or is about to)
  std::vector<int32_t> ids;  // the prompt, then the new tokens
  int64_t generated = 0;
  SplitMix64 rng{0};
  std::unique_ptr<TextStream> text;
};

struct ContinuousBatcher::State {
  std::vector<const CausalLM*> models;
  const Tokenizer& tok;
  Options opt;
  std::unique_ptr<Backend> backend;
  ProgramCache programs;
  std::vector<TensorMap> weights;            // per model: what its programs bind (uploads on a device)
  std::vector<Tensor> cache;                 // k0, v0, k1, ...: [rows + 1, S, Hkv, D]; the last row is scratch
  std::map<std::tuple<size_t, int64_t, int64_t>, graph::Graph> graphs;  // (model, B, T)
  int64_t S = 0, C = 0, rows = 0;

  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Sequence>> queue;
  std::vector<std::unique_ptr<Sequence>> running;  // one per used row
  std::vector<char> row_used;
  bool stopping = false, drain = true;
  Metrics metrics;
  std::thread thread;

  State(std::vector<const CausalLM*> m, const Tokenizer& t, Options o)
      : models(std::move(m)), tok(t), opt(std::move(o)), backend(make_backend(models.at(0)->device())), programs(*backend, 64) {}

  static std::string cache_name(size_t i) { return fmt::format("past_key_values.{}.{}", i / 2, i % 2 == 0 ? "key" : "value"); }

  // ---- the step's phases ----
  void loop();
  bool admit();                                         // queued sequences into free rows
  void finish(Sequence& s, const std::string& reason, std::string error = {});
  void release(Sequence& s);
  void run(size_t model, std::vector<Sequence*>& batch, int64_t T);  // one program over these rows
  void take_token(Sequence& s, const float* logits_row, int64_t V, const Tensor& logits, int64_t b);
};

ContinuousBatcher::ContinuousBatcher(std::vector<const CausalLM*> models, const Tokenizer& tokenizer, Options options) {
  if (models.empty() || models[0] == nullptr) fail("continuous batching: no model");
  s_ = std::make_unique<State>(std::move(models), tokenizer, std::move(options));
  State& s = *s_;
  const CausalLM& base = *s.models[0];
  const ModelConfig& mc = base.config();
  if (base.tensor_parallel().size != 1) fail("continuous batching: a tensor-parallel shard cannot serve alone");
  if (s.opt.max_batch < 1) fail("max_batch must be >= 1, got {}", s.opt.max_batch);
  if (s.opt.max_queue < 0) fail("max_queue must be >= 0, got {}", s.opt.max_queue);
  if (s.opt.prefill_rows < 1) fail("prefill_rows must be >= 1, got {}", s.opt.prefill_rows);
  s.C = s.opt.prefill_chunk > 0 ? s.opt.prefill_chunk : s.backend->auto_pad_multiple();
  if (s.C < 1) s.C = 64;
  int64_t S = s.opt.max_model_len > 0 ? s.opt.max_model_len : std::min<int64_t>(2048, mc.max_position_embeddings);
  if (S > mc.max_position_embeddings)
    fail("max_model_len {} is more than the model's max_position_embeddings ({})", S, mc.max_position_embeddings);
  s.S = padded_length(S, s.C);  // whole chunks
  if (s.S > mc.max_position_embeddings) s.S = mc.max_position_embeddings / s.C * s.C;
  if (s.S < s.C) fail("max_model_len {} is shorter than one prefill chunk ({} tokens)", S, s.C);
  s.rows = s.opt.max_batch;
  for (size_t i = 0; i < s.models.size(); ++i) {
    const CausalLM& m = *s.models[i];
    if (m.config().hidden_size != mc.hidden_size || m.config().num_hidden_layers != mc.num_hidden_layers || m.dtype() != base.dtype())
      fail("continuous batching: model {} is not the base model with an adapter", i);
    s.weights.push_back(to_backend(*s.backend, m.weights()));
  }
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l)
    for (int kv = 0; kv < 2; ++kv) {
      Tensor t = s.backend->allocate(base.dtype(), {s.rows + 1, s.S, mc.num_key_value_heads, mc.head_dim}, State::cache_name(s.cache.size()));
      s.backend->zero(t);
      s.cache.push_back(std::move(t));
    }
  s.row_used.assign(static_cast<size_t>(s.rows), 0);
  s.metrics.max_batch = s.rows;
  s.thread = std::thread([&s] { s.loop(); });
}

ContinuousBatcher::~ContinuousBatcher() { shutdown(false); }

int64_t ContinuousBatcher::max_model_len() const { return s_->S; }
int64_t ContinuousBatcher::max_batch() const { return s_->rows; }
int64_t ContinuousBatcher::capacity() const { return s_->rows + s_->opt.max_queue; }

int64_t ContinuousBatcher::room_after(int64_t prompt_tokens) const {
  const int64_t used = (prompt_tokens + s_->C - 1) / s_->C * s_->C;
  return used >= s_->S ? 0 : s_->S - used;
}

ContinuousBatcher::Metrics ContinuousBatcher::metrics() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  Metrics m = s_->metrics;
  m.waiting = static_cast<int64_t>(s_->queue.size());
  m.running = std::count_if(s_->running.begin(), s_->running.end(), [](const auto& q) { return !q->done && q->row >= 0; });
  return m;
}

std::shared_ptr<ContinuousBatcher::Ticket> ContinuousBatcher::submit(SequenceRequest r, Sink sink) {
  State& s = *s_;
  const ModelConfig& mc = s.models[0]->config();
  const int64_t L = static_cast<int64_t>(r.prompt.size());
  if (L == 0) fail("prompt: empty (a prompt needs at least one token)");
  for (int32_t id : r.prompt)
    if (id < 0 || id >= mc.vocab_size) fail("prompt: token id {} is outside the vocabulary [0, {})", id, mc.vocab_size);
  if (r.max_new_tokens < 1) fail("max_new_tokens: must be >= 1, got {}", r.max_new_tokens);
  const int64_t room = room_after(L);
  if (room < 1) fail("prompt: {} tokens do not fit the server's max_model_len ({} tokens in chunks of {})", L, s.S, s.C);
  if (r.max_new_tokens > room)
    fail("max_new_tokens: {} new tokens after a prompt of {} tokens need {} positions, more than max_model_len ({})", r.max_new_tokens, L,
         (L + s.C - 1) / s.C * s.C + r.max_new_tokens, s.S);
  if (r.model >= s.models.size()) fail("model: no model {} (the server has {})", r.model, s.models.size());
  const SamplingParams& p = r.sampling;
  if (p.do_sample && !(p.temperature > 0)) fail("temperature: must be > 0 when sampling, got {}", p.temperature);
  if (p.top_k < 0) fail("top_k: must be >= 0, got {}", p.top_k);
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("top_p: must be in (0, 1], got {}", p.top_p);
  if (p.min_p && !(*p.min_p >= 0 && *p.min_p <= 1)) fail("min_p: must be in [0, 1], got {}", *p.min_p);
  if (!(p.repetition_penalty > 0)) fail("repetition_penalty: must be > 0, got {}", p.repetition_penalty);
  for (int32_t id : r.eos_token_ids)
    if (id < 0 || id >= mc.vocab_size) fail("eos_token_id: {} is outside the vocabulary [0, {})", id, mc.vocab_size);

  auto seq = std::make_unique<Sequence>();
  auto ticket = std::make_shared<Ticket>();
  seq->cancelled = ticket->cancelled_;
  seq->submitted = Clock::now();
  seq->rng = SplitMix64(r.seed);
  seq->text = std::make_unique<TextStream>(s.tok, r.stop, r.skip_special_tokens);
  seq->ids = r.prompt;
  seq->chunks = (L + s.C - 1) / s.C;
  seq->first = seq->chunks * s.C - L;
  seq->req = std::move(r);
  seq->sink = std::move(sink);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const int64_t unfinished = s.metrics.sequences - s.metrics.finished;  // running or waiting
    if (s.stopping || unfinished >= s.rows + s.opt.max_queue) return nullptr;
    s.queue.push_back(std::move(seq));
    ++s.metrics.sequences;
    s.metrics.prompt_tokens += L;
  }
  s.wake.notify_one();
  return ticket;
}

void ContinuousBatcher::shutdown(bool drain) {
  if (!s_) return;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stopping = true;
    s_->drain = s_->drain && drain;
  }
  s_->wake.notify_all();
  if (s_->thread.joinable()) s_->thread.join();
}

bool ContinuousBatcher::State::admit() {
  std::lock_guard<std::mutex> lock(mu);
  if (stopping && !drain) {
    for (auto& q : queue) running.push_back(std::move(q));  // finished as aborted by the loop
    queue.clear();
    return true;
  }
  while (!queue.empty()) {
    if (queue.front()->cancelled->load()) {  // cancelled while it waited: it leaves without a row
      running.push_back(std::move(queue.front()));
      queue.pop_front();
      continue;
    }
    const auto free = std::find(row_used.begin(), row_used.end(), 0);
    if (free == row_used.end()) break;
    *free = 1;
    queue.front()->row = free - row_used.begin();
    running.push_back(std::move(queue.front()));
    queue.pop_front();
  }
  return !running.empty();
}

void ContinuousBatcher::State::finish(Sequence& s, const std::string& reason, std::string error) {
  SequenceDelta d;
  d.finished = true;
  d.finish_reason = reason;
  d.error = std::move(error);
  d.text = s.text->take(true);
  d.prompt_tokens = static_cast<int64_t>(s.req.prompt.size());
  d.completion_tokens = s.generated;
  release(s);
  if (s.sink) s.sink(d);
  s.sink = nullptr;
}

// A finished sequence's row is free and it is counted before its sink hears of it (a client that reads the metrics
// after its answer sees its sequence finished).
void ContinuousBatcher::State::release(Sequence& s) {
  std::lock_guard<std::mutex> lock(mu);
  if (s.row >= 0) row_used[static_cast<size_t>(s.row)] = 0;
  s.row = -1;
  s.done = true;
  ++metrics.finished;
}

// The new token of row b of `logits` [B, V]: chosen where the logits are, with the sequence's parameters and draw.
void ContinuousBatcher::State::take_token(Sequence& s, const float* host_row, int64_t V, const Tensor& logits, int64_t b) {
  Backend::SampleRequest r;
  r.rows = 1, r.row_stride = 1, r.row_offset = b, r.params = s.req.sampling;
  r.uniforms = {static_cast<double>(s.rng.next() >> 11) * 0x1.0p-53};
  Tensor context;
  if (r.params.repetition_penalty != 1.0f) {
    context = to_backend(*backend, Tensor::from_i32(s.ids, {1, static_cast<int64_t>(s.ids.size())}), "the row's ids so far");
    r.context = &context;
  }
  const int32_t id = backend->sample(logits, r).at(0);
  if (s.generated == 0) {
    std::lock_guard<std::mutex> lock(mu);
    metrics.first_token_seconds += seconds_since(s.submitted);
    ++metrics.first_tokens;
  }
  s.ids.push_back(id);
  ++s.generated;
  SequenceDelta d;
  d.ids = {id};
  if (s.req.logprobs >= 0 && host_row != nullptr) {
    d.logprobs.emplace_back();
    d.top_logprobs.emplace_back();
    row_logprobs(host_row, V, id, s.req.logprobs, d.logprobs.back(), d.top_logprobs.back());
    if (s.req.logprobs == 0) d.top_logprobs.clear();
  }
  const bool eos = std::find(s.req.eos_token_ids.begin(), s.req.eos_token_ids.end(), id) != s.req.eos_token_ids.end();
  const size_t counted = s.ids.size() - (eos ? 1 : 0);
  std::vector<int32_t> gen(s.ids.begin() + static_cast<int64_t>(s.req.prompt.size()), s.ids.begin() + static_cast<int64_t>(counted));
  const bool stopped = s.text->update(gen, gen.size());
  const bool length = s.generated >= s.req.max_new_tokens;
  d.finished = eos || stopped || length;
  d.finish_reason = eos || stopped ? "stop" : length ? "length" : "";
  d.text = s.text->take(d.finished);
  d.prompt_tokens = static_cast<int64_t>(s.req.prompt.size());
  d.completion_tokens = s.generated;
  {
    std::lock_guard<std::mutex> lock(mu);
    ++metrics.generated_tokens;
  }
  if (d.finished) release(s);
  if (s.sink) s.sink(d);
  if (d.finished) {
    s.sink = nullptr;
    return;
  }
  s.pending = id;
  s.decoding = true;
}

// One program over `batch` (sequences of one model), T = 1 (decode) or C (a prompt chunk each): inputs per row,
// padded to a bucket with rows that point at the scratch cache row and see nothing.
void ContinuousBatcher::State::run(size_t model, std::vector<Sequence*>& batch, int64_t T) {
  const int64_t n = static_cast<int64_t>(batch.size()), B = bucket_of(n, T == 1 ? rows : std::min(rows, opt.prefill_rows));
  const int32_t scratch = static_cast<int32_t>(rows);
  Tensor ids = Tensor::zeros(DType::I32, {B, T}), pos = Tensor::zeros(DType::I32, {B, T}), qpos = Tensor::zeros(DType::I32, {B, T});
  Tensor mask = Tensor::zeros(DType::I32, {B, S}), cpos = Tensor::zeros(DType::I32, {B}), crow = Tensor::zeros(DType::I32, {B});
  int32_t* pi = ids.mutable_data_as<int32_t>();
  int32_t* pp = pos.mutable_data_as<int32_t>();
  int32_t* pq = qpos.mutable_data_as<int32_t>();
  int32_t* pm = mask.mutable_data_as<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    crow.mutable_data_as<int32_t>()[b] = b < n ? static_cast<int32_t>(batch[static_cast<size_t>(b)]->row) : scratch;
    if (b >= n) continue;
    Sequence& s = *batch[static_cast<size_t>(b)];
    const int64_t start = T == 1 ? s.slot : s.next_chunk * C;  // the first slot written
    cpos.mutable_data_as<int32_t>()[b] = static_cast<int32_t>(start);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = start + t;
      pq[b * T + t] = static_cast<int32_t>(slot);
      if (slot < s.first) continue;  // chunk padding: id 0, position 0, masked
      pi[b * T + t] = T == 1 ? s.pending : s.ids[static_cast<size_t>(slot - s.first)];
      pp[b * T + t] = static_cast<int32_t>(slot - s.first);
    }
    for (int64_t j = s.first; j < start + T; ++j) pm[b * S + j] = 1;
  }
  const CausalLM& m = *models[model];
  auto g = graphs.find({model, B, T});
  if (g == graphs.end()) {
    g = graphs.emplace(std::make_tuple(model, B, T), m.slots_graph(B, T, rows + 1, S)).first;
    const std::string what = fmt::format("model {}: {} B{} T{} S{}", model, T == 1 ? "decode" : "prefill chunk", B, T, S);
    {
      std::lock_guard<std::mutex> lock(mu);
      metrics.programs.push_back(what);
    }
    if (opt.log) opt.log("compiled " + what);
  }
  TensorMap in = weights[model];
  in["input_ids"] = to_backend(*backend, ids, "input_ids");
  in["position_ids"] = to_backend(*backend, pos, "position_ids");
  in["query_positions"] = to_backend(*backend, qpos, "query_positions");
  in["attention_mask"] = to_backend(*backend, mask, "attention_mask");
  in["cache_position"] = to_backend(*backend, cpos, "cache_position");
  in["cache_rows"] = to_backend(*backend, crow, "cache_rows");
  for (size_t i = 0; i < cache.size(); ++i) in[cache_name(i)] = cache[i];
  const auto res = programs.get(g->second).run(in);
  for (size_t i = 0; i < cache.size(); ++i) {  // a program that returned other memory than the bound cache (the reference)
    const Tensor& updated = res[g->second.output_index(cache_name(i))];
    if (updated.is_device()) {
      if (updated.device_handle() != cache[i].device_handle()) cache[i] = backend->copy(updated, cache_name(i));
    } else if (updated.data() != cache[i].data()) {
      cache[i].copy_from(updated);
    }
  }
  const Tensor& logits = res[g->second.output_index("logits")];
  const int64_t V = logits.shape().back();
  bool want_logprobs = false;
  for (int64_t b = 0; b < n; ++b) want_logprobs |= batch[static_cast<size_t>(b)]->req.logprobs >= 0;
  Tensor host;
  if (want_logprobs) host = to_host(*backend, logits).to(DType::F32);
  {
    std::lock_guard<std::mutex> lock(mu);
    ++metrics.steps;
    if (T == 1) ++metrics.decode_steps, metrics.decode_rows += n, metrics.decode_slots += B;
    else ++metrics.prefill_steps;
  }
  for (int64_t b = 0; b < n; ++b) {
    Sequence& s = *batch[static_cast<size_t>(b)];
    if (T == 1) {
      ++s.slot;
    } else if (++s.next_chunk < s.chunks) {
      continue;  // more of the prompt to prefill
    } else {
      s.slot = s.chunks * C;
    }
    take_token(s, want_logprobs ? host.data_as<float>() + b * V : nullptr, V, logits, b);
  }
}

void ContinuousBatcher::State::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      wake.wait(lock, [&] { return stopping || !queue.empty() || !running.empty(); });
      if (stopping && queue.empty() && running.empty()) return;
    }
    admit();
    const auto t0 = Clock::now();
    // Finished, cancelled or (shutting down without drain) aborted sequences leave first.
    bool abort_all;
    {
      std::lock_guard<std::mutex> lock(mu);
      abort_all = stopping && !drain;
    }
    for (auto& s : running)
      if (!s->done && (abort_all || s->cancelled->load())) finish(*s, "abort");
    // A step per model: a chunk of up to prefill_rows prompts, then one token for every decoding row.
    for (size_t model = 0; model < models.size(); ++model) {
      std::vector<Sequence*> prefill, decode;
      for (auto& s : running) {
        if (s->done || s->row < 0 || s->req.model != model) continue;
        if (s->decoding) decode.push_back(s.get());
        else if (static_cast<int64_t>(prefill.size()) < opt.prefill_rows) prefill.push_back(s.get());
      }
      for (auto* batch : {&prefill, &decode}) {
        if (batch->empty()) continue;
        try {
          run(model, *batch, batch == &prefill ? C : 1);
        } catch (const std::exception& e) {
          for (Sequence* s : *batch)
            if (!s->done) finish(*s, "error", e.what());
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      metrics.busy_seconds += seconds_since(t0);
      running.erase(std::remove_if(running.begin(), running.end(), [](const auto& s) { return s->done; }), running.end());
    }
  }
}

}  // namespace trl

// Continuous batching over the static-cache programs (`trl serve`, docs/SERVE.md). Sequences join and leave a
// running batch between steps: each holds a row of one shared KV cache ([rows, S, kv heads, head_dim] per layer, the
// cache of generate() with rows that outlive a call), its prompt is prefilled chunk by chunk into that row, and one
// decode program advances every running row by a token. The programs are CausalLM::slots_graph's: a batch of B rows
// names its cache rows, so any set of running sequences decodes together, and a server compiles one program per
// (model, batch bucket, tokens) with B in {1, 2, 4, ..., max_batch} and tokens in {1, prefill_chunk}.
//
// Threads: submit() and cancel() from any thread; the steps run on the batcher's own thread, which also calls each
// sequence's sink with what a step added to it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trl/backend/sampling.h"
#include "trl/models/causal_lm.h"

namespace trl {

class Tokenizer;

// One sequence to generate (a request with n choices submits n of them).
struct SequenceRequest {
  std::vector<int32_t> prompt;              // token ids, at least one
  int64_t max_new_tokens = 16;              // >= 1; prompt (in whole chunks) + max_new_tokens must fit a row
  SamplingParams sampling;                  // greedy unless do_sample
  uint64_t seed = 0;                        // the sequence's own stream of draws: same seed, same tokens in any batch
  std::vector<int32_t> eos_token_ids;       // ids that end the sequence (counted, never in the text)
  std::vector<std::string> stop;            // stop strings: the text ends before the first one found
  int64_t logprobs = -1;                    // -1: none; 0: the chosen token's log-prob; k > 0: also the k most likely
  size_t model = 0;                         // which of the batcher's models: 0 the base, then the adapters
  bool skip_special_tokens = true;          // in the text (the ids keep every token)
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
};

// What one step added to a sequence, given to its sink; the last one has `finished`.
struct SequenceDelta {
  std::vector<int32_t> ids;                             // new token ids (the eos id included)
  std::string text;                                     // new text: whole UTF-8 characters, never part of a stop string
  std::vector<TokenLogprob> logprobs;                   // with logprobs >= 0: one per new id
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // with logprobs > 0: the most likely tokens at each new id
  bool finished = false;
  std::string finish_reason;  // "stop" (eos or a stop string), "length", "abort" (cancelled or shut down), "error"
  std::string error;          // with "error": what went wrong
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

class ContinuousBatcher {
 public:
  struct Options {
    int64_t max_batch = 8;       // running sequences (cache rows)
    int64_t max_model_len = 0;   // slots per row (prompt, its chunk padding, and new tokens); 0: min(2048, the model's)
    int64_t prefill_chunk = 0;   // prompt tokens per row and prefill step; 0: the backend's pad_to_multiple_of "auto"
    int64_t prefill_rows = 4;    // at most this many prompts advance by a chunk per step
    int64_t max_queue = 256;     // waiting sequences beyond the running ones; submit() refuses more
    std::function<void(const std::string&)> log;  // a line per compiled program (--verbose)
  };
  struct Metrics {
    int64_t sequences = 0, finished = 0, prompt_tokens = 0, generated_tokens = 0;
    int64_t running = 0, waiting = 0, max_batch = 0;
    int64_t steps = 0, decode_steps = 0, prefill_steps = 0, decode_rows = 0, decode_slots = 0;  // occupancy = rows / slots
    double first_token_seconds = 0;   // summed over sequences that produced a token
    int64_t first_tokens = 0;
    double busy_seconds = 0;          // time spent in steps
    std::vector<std::string> programs;  // "model 0: decode B8", ...
  };
  using Sink = std::function<void(const SequenceDelta&)>;
  // A submitted sequence: cancel() frees its row at the next step (its sink then gets "abort").
  class Ticket {
   public:
    void cancel() { cancelled_->store(true); }
   private:
    friend class ContinuousBatcher;
    std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  };

  // models[0] is the base model; the others are the same base with an adapter (with_adapter: the base weights are
  // shared). Every model and the tokenizer must outlive the batcher.
  ContinuousBatcher(std::vector<const CausalLM*> models, const Tokenizer& tokenizer, Options options);
  ~ContinuousBatcher();  // shutdown(false)
  ContinuousBatcher(const ContinuousBatcher&) = delete;
  ContinuousBatcher& operator=(const ContinuousBatcher&) = delete;

  // Checks the request (a trl::Error naming the field, e.g. "max_new_tokens") and queues it; nullptr when the queue
  // is full or the batcher shuts down (nothing queued, the sink never called).
  std::shared_ptr<Ticket> submit(SequenceRequest request, Sink sink);
  // Refuses new sequences; drain = true lets the queued and running ones finish, false aborts them. Returns when the
  // batcher's thread has stopped.
  void shutdown(bool drain);
  // The most new tokens a prompt of `prompt_tokens` can have (0 when the prompt itself does not fit).
  int64_t room_after(int64_t prompt_tokens) const;
  int64_t max_model_len() const;
  int64_t max_batch() const;
  int64_t capacity() const;  // sequences running and waiting together at most: max_batch + max_queue
  Metrics metrics() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace trl

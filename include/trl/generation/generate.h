// generate(): Transformers' generation loop (facts: docs/GENERATION.md) on compiled programs with a static KV cache.
// Prompts are left-padded to a bucket (pad_to_multiple_of), so a run compiles one prefill program per (batch,
// prompt bucket) and one decode program per (batch, cache length), however many tokens it generates. The growing
// sequences and masks stay on the host; only fixed-shape inputs enter the programs, and the next tokens are chosen
// where the logits are (Backend::sample), so one id per row comes back.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trl/backend/backend.h"
#include "trl/backend/program_cache.h"
#include "trl/backend/sampling.h"  // SamplingParams, process_logits, pick_token
#include "trl/models/causal_lm.h"

namespace trl {

class Tokenizer;

// Every unset field comes from the model's generation_config.json when it has one, else Transformers' default.
struct GenerationConfig {
  std::optional<int64_t> max_new_tokens;           // default: max_length - prompt length
  std::optional<int64_t> max_length;               // default 20 (prompt included), used when max_new_tokens is unset
  std::optional<bool> do_sample;                   // default false (greedy)
  std::optional<float> temperature;                // default 1.0
  std::optional<int64_t> top_k;                    // default 50; 0 = off
  std::optional<float> top_p;                      // default 1.0 = off
  std::optional<float> min_p;                      // default off
  std::optional<float> repetition_penalty;         // default 1.0 = off
  std::optional<uint64_t> seed;                    // sampling seed (default 0): same seed, same output
  // One sampling stream per row (rows after the num_return_sequences expansion), instead of one for the batch
  // seeded by `seed`: a row's draws then do not depend on the rows beside it, so its tokens are the same in any
  // batch (data-parallel GRPO generates each rank's rows of a round with the seeds of their places in the round).
  std::vector<uint64_t> row_seeds;
  std::optional<std::vector<int32_t>> eos_token_id;
  std::optional<int32_t> pad_token_id;             // default: the first eos id
  std::vector<std::string> stop_strings;           // needs a tokenizer
  int64_t num_return_sequences = 1;
  std::string cache_implementation = "static";     // "static" | "dynamic" (no cache: the whole sequence every step)
  bool disable_compile = false;                    // run on the reference backend (the oracle), as Transformers' flag
  std::optional<int64_t> pad_to_multiple_of;       // prompt and cache bucket; default the backend's "auto"; 0 = none
  bool output_logits = false;                      // keep each step's raw f32 logits (GenerationOutput::logits)
  // Called for every new token of a row that has not finished, as it is produced.
  std::function<void(int64_t row, int32_t token)> streamer;
  // Asked before each new token: true stops every unfinished row (finish reason "interrupted"; Ctrl-C in `trl chat`).
  std::function<bool()> interrupted;

  // The generation_config.json of a model folder (missing file: nothing set).
  static GenerationConfig from_model_dir(const std::string& dir);
  std::string source;  // the file these values were read from ("" when none): errors about them name it
  // " (from FILE)" for a value this config gives (an error about a default names the file it came from), else "".
  std::string origin() const { return source.empty() ? "" : " (from " + source + ")"; }
};

struct GenerationOutput {
  // Per row (num_return_sequences rows per prompt, consecutive): the left-padded prompt and the generated tokens,
  // finished rows right-filled with pad — Transformers' `sequences`.
  std::vector<std::vector<int32_t>> sequences;
  std::vector<std::vector<int32_t>> generated;      // only the new tokens of each row, without padding
  std::vector<std::string> finish_reasons;          // "eos", "stop_string", "length" or "interrupted"
  int64_t prompt_length = 0;                        // the padded prompt length (bucket)
  int64_t cache_length = 0;                         // the static cache's max_cache_len
  std::vector<std::vector<std::vector<float>>> logits;  // with output_logits: [step][row][vocab], before processing
};

class Generator {
 public:
  // Generation programs are compiled for `model` on the CPU backend (reference backend with disable_compile).
  // The model must outlive the generator.
  explicit Generator(const CausalLM& model);
  ~Generator();
  GenerationOutput generate(const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& config, const Tokenizer* tokenizer = nullptr);
  // Program counters of the compiled (CPU) path: compilations and hits.
  const ProgramCacheStats& stats() const;
  // The defaults this generator starts from (the model folder's generation_config.json).
  const GenerationConfig& defaults() const { return defaults_; }
  // What crossed between the host and the model's device so far (nothing on a host backend): on a device the
  // weights go up once, then per step the new ids, positions and mask go up (with a repetition penalty, the rows'
  // ids so far too) and one chosen id per row comes down.
  Backend::Transfers transfers() const;

 private:
  struct State;
  const CausalLM& model_;
  GenerationConfig defaults_;
  std::unique_ptr<State> state_;
};

// The greedy answer of `generator`'s model to the first user turn of each conversational row ({"messages": [user,
// assistant, ...]}), rendered by the chat template with the generation prompt (thinking off), beside the row's first
// assistant turn: how `trl demo` and the learning tests check what a fine-tuned model learned.
struct ChatAnswer {
  std::string question, expected, answer;
  bool exact = false;
};
std::vector<ChatAnswer> greedy_chat_answers(Generator& generator, const Tokenizer& tokenizer, const std::vector<nlohmann::ordered_json>& rows,
                                            int64_t max_new_tokens);

}  // namespace trl

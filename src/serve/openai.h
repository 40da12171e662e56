// The OpenAI API's requests and responses (`trl serve`, docs/SERVE.md): what a body asks for, checked field by field
// (a bad field is an ApiError that names it, answered as OpenAI answers it: {"error": {message, type, param, code}}),
// and the JSON of completions, chat completions and their streamed chunks. No HTTP here: server.cpp does that.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/generation/continuous.h"

namespace trl {
class Tokenizer;
}

namespace trl::serve {

using ojson = nlohmann::ordered_json;

// An answer other than 200: HTTP status, OpenAI's error type and the field at fault ("" when none).
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = {}, std::string type = {})
      : std::runtime_error(message), status(status), param(std::move(param)),
        type(type.empty() ? (status == 401 ? "authentication_error" : status == 404 ? "not_found_error" : status == 429 ? "rate_limit_error"
                                              : status >= 500 ? "server_error" : "invalid_request_error")
                          : std::move(type)) {}
  int status;
  std::string param, type;
};
// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& e);

// What the server knows when it reads a request.
struct ServedModels {
  std::vector<std::string> names;  // names[i] is batcher model i: the base, then each adapter
  const Tokenizer* tokenizer = nullptr;
  SamplingParams defaults;         // the model's generation_config.json (do_sample, temperature, top_k, top_p)
  std::vector<int32_t> eos_token_ids;
  int64_t max_n = 16;              // choices per request
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;          // the model's: token ids in a prompt are below it
};

// One request, read: its prompts as token ids, and what each of its sequences asks of the batcher.
struct ApiRequest {
  bool chat = false;
  size_t model = 0;
  std::string model_name;
  std::vector<std::vector<int32_t>> prompts;  // chat: one; completions: one per prompt
  std::vector<std::string> prompt_texts;      // completions with echo: the prompt's text
  std::optional<int64_t> max_tokens;          // unset: what is left of max_model_len after the prompt
  int64_t n = 1;
  bool stream = false, include_usage = false, echo = false, return_token_ids = false;
  int64_t logprobs = -1;                      // -1: none; else how many top tokens per position (0: only the chosen)
  std::optional<uint64_t> seed;
  SequenceRequest sequence;                   // sampling, stop strings, eos, logprobs, model: the same for every choice
};

// Reads a /v1/chat/completions (chat = true) or /v1/completions body. ApiError for anything wrong, with the field.
ApiRequest parse_request(const std::string& body, bool chat, const ServedModels& served);

// The JSON of one finished choice and of the whole response.
struct ChoiceResult {
  std::vector<int32_t> ids;
  std::string text, finish_reason;
  std::vector<TokenLogprob> logprobs;
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  int64_t prompt_index = 0;  // completions: which prompt
};
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
ojson response_json(const ApiRequest& r, const std::string& id, int64_t created, const std::vector<ChoiceResult>& choices, const Usage& usage,
                    const Tokenizer& tok);
// One streamed chunk for choice `index` with what a step added (chat: the first chunk of a choice carries the role).
ojson chunk_json(const ApiRequest& r, const std::string& id, int64_t created, int64_t index, const SequenceDelta& d, bool first, const Tokenizer& tok);
ojson usage_chunk_json(const ApiRequest& r, const std::string& id, int64_t created, const Usage& usage);

}  // namespace trl::serve

// libFuzzer target: the request bodies `trl serve` reads (docs/TESTING.md, "Fuzzing"; src/serve/openai.cpp). The first
// byte picks the endpoint (even: /v1/chat/completions, odd: /v1/completions), the rest is the body. A body ends in a
// request or an ApiError (the server's 4xx answer); anything else is a finding, as is a request that breaks what the
// batcher relies on (a token id outside the vocabulary, n or max_tokens beyond the server's limits). The answer's JSON
// is then made from the request as the server makes it (echoed prompt text, log-probs, a streamed chunk, an error
// body) and written out.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "serve/openai.h"
#include "tokenizer_folder.h"
#include "trl/core/error.h"
#include "trl/tokenizer/tokenizer.h"

namespace {

constexpr int64_t kVocab = 512;  // the smallest cut of Qwen3's tokenizer, with its chat template
constexpr int64_t kMaxModelLen = 256;

const trl::serve::ServedModels& served() {
  static const trl::Tokenizer tok = trl::Tokenizer::from_pretrained(trl::fuzz::tokenizer_folder(kVocab));
  static const trl::serve::ServedModels s = [] {
    trl::serve::ServedModels m;
    m.names = {"base", "adapter"};
    m.tokenizer = &tok;
    m.eos_token_ids = {2};
    m.max_n = 4;
    m.max_model_len = kMaxModelLen;
    m.vocab_size = kVocab;
    return m;
  }();
  return s;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

// The answer the server would write for `r`: one choice per prompt and n, its tokens the prompt's first ones.
void answer(const trl::serve::ApiRequest& r) {
  const trl::Tokenizer& tok = *served().tokenizer;
  using trl::serve::ojson;
  std::vector<trl::serve::ChoiceResult> choices;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    trl::serve::ChoiceResult c;
    c.prompt_index = static_cast<int64_t>(p);
    c.ids.assign(r.prompts[p].begin(), r.prompts[p].begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(r.prompts[p].size(), 16)));
    c.text = tok.decode(c.ids, r.sequence.skip_special_tokens);
    c.finish_reason = "length";
    if (r.logprobs >= 0)
      for (int32_t id : c.ids) {
        c.logprobs.push_back({id, -1.0f});
        c.top_logprobs.push_back(std::vector<trl::TokenLogprob>(static_cast<size_t>(r.logprobs), {id, -1.0f}));
      }
    choices.push_back(std::move(c));
  }
  (void)trl::serve::response_json(r, "cmpl-1", 0, choices, {3, 4}, tok).dump(-1, ' ', false, ojson::error_handler_t::replace);
  trl::SequenceDelta d;
  d.ids = choices.front().ids;
  d.text = choices.front().text;
  d.logprobs = choices.front().logprobs;
  d.top_logprobs = choices.front().top_logprobs;
  (void)trl::serve::chunk_json(r, "cmpl-1", 0, 0, d, true, tok).dump(-1, ' ', false, ojson::error_handler_t::replace);
  (void)trl::serve::usage_chunk_json(r, "cmpl-1", 0, {3, 4}).dump();
}

}  // namespace

#ifndef TRL_FUZZ_REGRESSION
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)served();
  return 0;
}
#endif

TRL_FUZZ_TARGET(serve) {
  if (size == 0) return 0;
  const bool chat = data[0] % 2 == 0;
  const std::string body = trl::fuzz::text(data + 1, size - 1);
  trl::serve::ApiRequest r;
  try {
    r = trl::serve::parse_request(body, chat, served());
  } catch (const trl::serve::ApiError& e) {
    check(e.status >= 400 && e.status < 500);
    (void)trl::serve::error_body(e);
    return 0;
  }
  // What the batcher and the answer rely on.
  check(!r.prompts.empty() && r.model < served().names.size());
  for (const auto& p : r.prompts) {
    check(!p.empty());
    for (int32_t id : p) check(id >= 0 && id < kVocab);
  }
  for (int32_t id : r.sequence.eos_token_ids) check(id >= 0 && id < kVocab);
  check(r.n >= 1 && r.n <= served().max_n);
  check(!r.max_tokens || (*r.max_tokens >= 1 && *r.max_tokens <= kMaxModelLen));
  check(r.logprobs >= -1 && r.logprobs <= 20);
  answer(r);
  return 0;
}

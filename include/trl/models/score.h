// Scoring text with a model (`trl score`, like llama-perplexity): the log-probability of each next token, the
// total negative log-likelihood and the perplexity.
#pragma once

#include <cstdint>
#include <vector>

#include "trl/models/causal_lm.h"

namespace trl {

struct SequenceScore {
  std::vector<int32_t> ids;
  std::vector<double> token_logprobs;  // log p(ids[t] | ids[<t]) for t = 1..n-1
  double nll = 0;                      // -sum(token_logprobs)
  int64_t n_scored = 0;                // n - 1
  double perplexity() const;           // exp(nll / n_scored); 1 when nothing is scored
};

// Scores each sequence (at least one id each). Sequences are batched `batch_size` at a time, right-padded to the
// backend's bucket (Backend::auto_pad_multiple) with the padding masked out, so results do not depend on the
// batching, and a call compiles one program per bucket length (cached). The log-probabilities come from the
// token_logprobs op (one chunked pass over the vocabulary): no [B, T, V] logits are held.
std::vector<SequenceScore> score_sequences(const CausalLM& model, const std::vector<std::vector<int32_t>>& sequences, Backend& backend,
                                           int64_t batch_size = 8);

}  // namespace trl

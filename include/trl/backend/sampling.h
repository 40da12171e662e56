// generate()'s choice of the next token: Transformers' logits processors and the greedy or sampled pick, as plain
// host functions on one row. Backend::sample runs them where the logits are (the host backends call these; a device
// backend runs its own kernels with the same results), so only one id per row reaches the host.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace trl {

// Transformers' order: repetition penalty (greedy and sampling), then, when sampling, temperature, top-k, top-p,
// min-p.
struct SamplingParams {
  bool do_sample = false;
  float temperature = 1.0f;
  int64_t top_k = 50;  // 0: off
  float top_p = 1.0f;  // 1: off
  std::optional<float> min_p;
  float repetition_penalty = 1.0f;  // 1: off
};

// Processes one row of scores in place. `context` is the row's ids so far (the prompt with its pads, then the
// generated ids); ids outside [0, scores.size()) are ignored.
void process_logits(std::vector<float>& scores, const std::vector<int32_t>& context, const SamplingParams& p);
void process_logits(std::vector<float>& scores, const int32_t* context, int64_t context_length, const SamplingParams& p);
// Greedy: the first maximum. Sampling: a draw from softmax(scores) with `u` uniform in [0, 1); -inf scores are
// never drawn. A row of -inf only gives 0.
int32_t pick_token(const std::vector<float>& scores, bool do_sample, double u);

}  // namespace trl

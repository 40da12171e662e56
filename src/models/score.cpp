#include "models/score.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace trl {

double SequenceScore::perplexity() const { return n_scored > 0 ? std::exp(nll / static_cast<double>(n_scored)) : 1.0; }

std::vector<SequenceScore> score_sequences(const CausalLM& model, const std::vector<std::vector<int32_t>>& sequences, Backend& backend,
                                           int64_t batch_size) {
  if (batch_size < 1) fail("score: batch_size must be at least 1");
  std::vector<SequenceScore> out;
  const int64_t V = model.config().vocab_size;
  for (size_t first = 0; first < sequences.size(); first += static_cast<size_t>(batch_size)) {
    const size_t last = std::min(sequences.size(), first + static_cast<size_t>(batch_size));
    const int64_t B = static_cast<int64_t>(last - first);
    int64_t T = 0;
    for (size_t i = first; i < last; ++i) {
      if (sequences[i].empty()) fail("score: sequence {} is empty", i);
      T = std::max<int64_t>(T, static_cast<int64_t>(sequences[i].size()));
    }
    Batch batch;
    batch.input_ids = Tensor::zeros(DType::I32, {B, T});
    batch.attention_mask = Tensor::zeros(DType::I32, {B, T});
    for (int64_t b = 0; b < B; ++b) {
      const auto& seq = sequences[first + static_cast<size_t>(b)];
      for (size_t t = 0; t < seq.size(); ++t) {
        batch.input_ids.mutable_data_as<int32_t>()[b * T + static_cast<int64_t>(t)] = seq[t];
        batch.attention_mask.mutable_data_as<int32_t>()[b * T + static_cast<int64_t>(t)] = 1;
      }
    }
    const Tensor logits = model.forward(batch, backend);
    const float* lg = logits.data_as<float>();
    for (int64_t b = 0; b < B; ++b) {
      SequenceScore s;
      s.ids = sequences[first + static_cast<size_t>(b)];
      for (size_t t = 1; t < s.ids.size(); ++t) {
        const float* row = lg + (b * T + static_cast<int64_t>(t) - 1) * V;
        double mx = -INFINITY;
        for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
        const double lp = static_cast<double>(row[s.ids[t]]) - mx - std::log(sum);
        s.token_logprobs.push_back(lp);
        s.nll -= lp;
      }
      s.n_scored = static_cast<int64_t>(s.token_logprobs.size());
      out.push_back(std::move(s));
    }
  }
  return out;
}

}  // namespace trl

#include "trl/models/score.h"

#include <algorithm>
#include <cmath>

#include "trl/backend/program_cache.h"
#include "trl/core/error.h"
#include "trl/runtime/shapes.h"

namespace trl {

double SequenceScore::perplexity() const { return n_scored > 0 ? std::exp(nll / static_cast<double>(n_scored)) : 1.0; }

std::vector<SequenceScore> score_sequences(const CausalLM& model, const std::vector<std::vector<int32_t>>& sequences, Backend& backend,
                                           int64_t batch_size) {
  if (batch_size < 1) fail("score: batch_size must be at least 1");
  const int64_t V = model.config().vocab_size;
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (sequences[i].empty()) fail("score: sequence {} is empty", i);
    for (int32_t id : sequences[i])
      if (id < 0 || id >= V) fail("score: sequence {} holds token id {}, outside the vocabulary [0, {})", i, id, V);
  }
  // Fixed shapes: every batch has the same rows (the last one padded with empty rows) and its length rounded up to
  // the backend's bucket, so a call compiles one program per bucket, not one per batch.
  const int64_t B = std::min<int64_t>(batch_size, static_cast<int64_t>(sequences.size()));
  const int64_t multiple = backend.auto_pad_multiple();
  ProgramCache programs(backend, 16);
  // The weights in the backend's memory once (uploaded to a device); each batch goes up, its log-probs (what the
  // caller asked for) come down.
  const TensorMap weights = to_backend(backend, model.weights());
  std::vector<SequenceScore> out;
  for (size_t first = 0; first < sequences.size(); first += static_cast<size_t>(B)) {
    const size_t last = std::min(sequences.size(), first + static_cast<size_t>(B));
    int64_t longest = 0;
    for (size_t i = first; i < last; ++i) longest = std::max<int64_t>(longest, static_cast<int64_t>(sequences[i].size()));
    const int64_t T = padded_length(longest, multiple);
    Tensor ids = Tensor::zeros(DType::I32, {B, T}), mask = Tensor::zeros(DType::I32, {B, T}), labels = Tensor::zeros(DType::I32, {B, T});
    for (size_t i = first; i < last; ++i) {
      const auto& seq = sequences[i];
      const int64_t row = static_cast<int64_t>(i - first) * T;
      for (size_t t = 0; t < seq.size(); ++t) {
        ids.mutable_data_as<int32_t>()[row + static_cast<int64_t>(t)] = seq[t];
        mask.mutable_data_as<int32_t>()[row + static_cast<int64_t>(t)] = 1;
        if (t + 1 < seq.size()) labels.mutable_data_as<int32_t>()[row + static_cast<int64_t>(t)] = seq[t + 1];
      }
    }
    TensorMap inputs = weights;
    inputs["input_ids"] = to_backend(backend, ids, "input_ids"), inputs["attention_mask"] = to_backend(backend, mask, "attention_mask");
    inputs["position_ids"] = to_backend(backend, default_position_ids(mask), "position_ids"), inputs["labels"] = to_backend(backend, labels, "labels");
    const graph::Graph g = model.logprobs_graph(B, T);
    const Tensor logp = to_host(backend, programs.get(g).run(inputs).at(g.output_index("token_logprobs")));
    for (size_t i = first; i < last; ++i) {
      SequenceScore s;
      s.ids = sequences[i];
      const int64_t row = static_cast<int64_t>(i - first) * T;
      for (size_t t = 1; t < s.ids.size(); ++t) {
        const double lp = logp.data_as<float>()[row + static_cast<int64_t>(t) - 1];
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

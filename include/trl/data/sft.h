// SFT data: the dataset formats of TRL's SFTTrainer turned into token ids and loss masks (docs/TRAINING.md), and the
// collators that make fixed-shape batches from them (padding to a bucket, best-fit-decreasing packing,
// padding-free rows).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trl/core/tensor.h"
#include "trl/data/dataset.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl {

struct SFTExample {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> labels_mask;  // 1 where the token is a label (TRL's labels != -100)
  std::string where;                 // the dataset row it came from
};

struct SFTDataOptions {
  int64_t max_length = 1024;                   // truncation (keep the start); <= 0: none
  std::optional<bool> completion_only_loss;    // None: true for prompt-completion data, false otherwise
  bool assistant_only_loss = false;            // needs a chat template with {% generation %}
  std::string dataset_text_field = "text";
  std::string eos_token;                       // appended to non-chat text/completions; "" = the tokenizer's
  bool truncate = true;                        // false when packing truncates by itself
  int64_t vocab_size = 0;                      // > 0: every token id must be below it (the model's embedding rows)
};

// Every id of `ids` is below `vocab_size` (the model's embedding rows; 0: unchecked): an error names the row, the
// field, the position and the id, when the data is read rather than inside the first step's embedding.
void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab_size, const std::string& where, const char* field);

// The format of a row: "language_modeling" (text), "conversational" (messages), "prompt_completion" (strings) or
// "conversational_prompt_completion" (message lists). Errors name the row.
std::string sft_format(const nlohmann::ordered_json& row, const std::string& text_field, const std::string& where);

// Tokenizes every row; rows whose labels are all masked after truncation are dropped (counted in *dropped).
std::vector<SFTExample> prepare_sft_dataset(const Dataset& data, const Tokenizer& tok, const SFTDataOptions& options, int64_t* dropped = nullptr);

// One micro-batch in the training graph's inputs. `weights` is 1 where position t predicts a label (token t+1 is a
// label of the same sequence), else 0: the trainer scales it by -1/num_items_in_batch.
struct SFTBatch {
  Tensor input_ids, attention_mask, position_ids, labels, weights;  // [B, T]
  int64_t num_items = 0;                                           // Σ weights
  int64_t num_tokens = 0;                                          // real (non-padding) tokens
};

// Right-pads the examples to the longest, rounded up to `multiple` (0 = none) and capped at max_length.
SFTBatch collate_padded(const std::vector<const SFTExample*>& examples, int32_t pad_id, int64_t multiple, int64_t max_length);
// Packs every example of each row in `rows` into one row of `length` tokens (segment ids 1, 2, ..., positions
// restarting per example, no attention across examples, tail padding 0).
SFTBatch collate_packed(const std::vector<std::vector<const SFTExample*>>& rows, int32_t pad_id, int64_t length);
// Best-fit decreasing: example indices grouped into bins whose total length is at most `capacity`.
std::vector<std::vector<size_t>> pack_best_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity);

}  // namespace trl

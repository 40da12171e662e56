// Preference data (DPO, reward models; KTO after unpairing): TRL's formats turned into token ids, and the rows a
// batch of pairs becomes (docs/TRAINING.md, "Preference data").
//
// A row has "chosen" and "rejected", and an explicit "prompt" or none (the implicit prompt: their longest common
// prefix, turn by turn for messages, character by character for text, as TRL's extract_prompt does). Standard rows
// hold strings, conversational rows lists of {"role", "content"}; the eos token is appended to standard
// completions that lack it. prompt_ids = the prompt (with the chat template's generation prompt for messages);
// chosen_ids = tokens(prompt + chosen) after the first |prompt_ids|, the same for rejected.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trl/data/dataset.h"
#include "trl/data/sft.h"
#include "trl/tokenizer/tokenizer.h"

namespace trl {

struct PreferenceExample {
  std::vector<int32_t> prompt_ids, chosen_ids, rejected_ids;
  std::string where;  // the dataset row it came from
  std::optional<double> margin;  // the row's "margin" (reward models)
};

struct PreferenceDataOptions {
  int64_t max_length = 1024;                // <= 0: none
  std::string truncation_mode = "keep_start";  // keep_start | keep_end (applied per sequence when batching)
  std::string eos_token;                     // "" = the tokenizer's
  int64_t vocab_size = 0;                    // > 0: every token id must be below it (check_token_ids)
};

struct PreferenceDataStats {
  int64_t dropped = 0;     // keep_start rows whose prompt alone fills max_length (no completion token would remain)
  int64_t mismatched = 0;  // rows whose tokenized prompt is not a prefix of tokenized prompt + completion
};

// The stats on stderr ("[trl] dpo: dropped 3 training rows ..."), nothing when both are 0. `method` is "dpo", "kto".
void report_preference_stats(const char* method, const char* split, const PreferenceDataStats& stats);

// Tokenizes every row (rows with "prompt_ids", "chosen_ids" and "rejected_ids" are taken as they are). A row without chosen or rejected, with an empty one, or mixing text and messages is an
// error naming the row and the field.
std::vector<PreferenceExample> prepare_preference_dataset(const Dataset& data, const Tokenizer& tok, const PreferenceDataOptions& options,
                                                          PreferenceDataStats* stats = nullptr);

// The 2·N rows of a batch of N pairs, [all chosen; all rejected]: prompt + completion, truncated to max_length by
// truncation_mode, labels_mask 1 on the completion tokens. collate_padded() (sft.h) turns them into one batch whose
// `weights` are 1 where position t predicts a completion token.
std::vector<SFTExample> preference_rows(const std::vector<const PreferenceExample*>& pairs, const PreferenceDataOptions& options);

// One sequence: prompt + completion, truncated to max_length by truncation_mode, labels_mask 1 on the completion.
SFTExample prompt_completion_row(const std::vector<int32_t>& prompt_ids, const std::vector<int32_t>& completion_ids, const PreferenceDataOptions& options,
                                 const std::string& where);

// KTO's unpaired data: a prompt, one completion, and whether it is desirable (the dataset's boolean `label`).
struct UnpairedExample {
  std::vector<int32_t> prompt_ids, completion_ids;
  bool desirable = true;
  std::string where;
};

// Rows {prompt, completion, label} (strings or messages), or preference pairs (a first row with "chosen" and
// "rejected") unpaired as TRL's unpair_preference_dataset does: per chunk of 1000 pairs, the chunk's chosen rows
// (label true), then its rejected rows (label false); an implicit prompt is extracted first. A missing field, a
// label that is not a boolean, an empty completion: an error naming the row and the field.
std::vector<UnpairedExample> prepare_unpaired_dataset(const Dataset& data, const Tokenizer& tok, const PreferenceDataOptions& options,
                                                      PreferenceDataStats* stats = nullptr);

}  // namespace trl

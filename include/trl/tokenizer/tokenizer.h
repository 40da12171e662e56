// Hugging Face tokenizers, natively: tokenizer.json (byte-level BPE models such as Qwen2/2.5/3, Llama 3, GPT-2)
// plus tokenizer_config.json (special tokens, chat template). encode() gives exactly the ids of the `tokenizers`
// library; decode() its text.
//
// Pipeline (as in `tokenizers`): split on added tokens (longest match first) -> normalize the other pieces
// (NFC, ...) -> pre-tokenize (Split with the file's regex via PCRE2, ByteLevel) -> BPE merges by rank -> post-process
// (ByteLevel: nothing; TemplateProcessing: BOS/EOS). Input that is not valid UTF-8 is first made valid by replacing
// each ill-formed subsequence with U+FFFD, as Python's and JavaScript's UTF-8 decoders do.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trl/core/tensor.h"

namespace trl {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// Options of a batch call, with Transformers' names and meanings.
struct TokenizeOptions {
  bool add_special_tokens = true;
  std::string padding = "longest";       // "longest" (alias true), "max_length", "do_not_pad" (alias false)
  std::optional<int64_t> max_length{};   // padding="max_length" target and truncation limit
  bool truncation = false;
  std::optional<int64_t> pad_to_multiple_of{};
  std::string padding_side = "right";    // "right" | "left"
  std::string truncation_side = "right"; // "right" keeps the start
};

struct BatchEncoding {
  std::vector<std::vector<int32_t>> input_ids;
  std::vector<std::vector<int32_t>> attention_mask;
  // [B, T] i32 tensors (rows must have equal length, i.e. padded).
  Tensor input_ids_tensor() const;
  Tensor attention_mask_tensor() const;
};

class Tokenizer {
 public:
  // Reads tokenizer.json; every unsupported component is an error that names it.
  static Tokenizer from_file(const std::string& tokenizer_json);
  // A model folder or hub id: tokenizer.json plus tokenizer_config.json (special tokens, chat template) when present.
  static Tokenizer from_pretrained(const std::string& name_or_path, const std::string& revision = "main");

  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // encode() plus, for each id, the [begin, end) byte range it covers in the UTF-8-sanitized text (empty ranges for
  // ids added by the post-processor). Where normalisation changed a piece, its tokens share the piece's range.
  std::vector<int32_t> encode_with_offsets(std::string_view text, bool add_special_tokens,
                                           std::vector<std::pair<size_t, size_t>>& offsets) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  BatchEncoding operator()(const std::vector<std::string>& texts, const TokenizeOptions& options = {}) const;
  // Pads/truncates already-tokenized rows by the same rules.
  BatchEncoding pad(std::vector<std::vector<int32_t>> rows, const TokenizeOptions& options = {}) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" for an unknown id
  int64_t vocab_size() const;                 // including added tokens
  const std::vector<AddedToken>& added_tokens() const;
  bool is_special(int32_t id) const;

  // From tokenizer_config.json (empty / nullopt when absent).
  const std::string& eos_token() const;
  const std::string& pad_token() const;
  const std::string& bos_token() const;
  const std::string& unk_token() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;  // falls back to eos, as TRL does
  std::optional<int32_t> bos_token_id() const;
  const std::string& chat_template() const;
  bool clean_up_tokenization_spaces() const;

 private:
  std::vector<int32_t> encode_impl(std::string_view text, bool add_special_tokens, std::vector<std::pair<size_t, size_t>>*& offsets) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trl

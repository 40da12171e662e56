// Reward functions for GRPO and RLOO (docs/TRAINING.md, "Reward functions"): TRL's contract
// f(prompts, completions, completion_ids, **columns) -> one number or None per completion, as C++ callables, as
// built-ins by name, as any program that speaks JSON lines (exec:COMMAND), or as a reward model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace trl {

// One batch of completions, as TRL passes it to a reward function.
struct RewardInputs {
  std::vector<nlohmann::ordered_json> prompts;      // a string, or the conversation (a list of messages)
  std::vector<nlohmann::ordered_json> completions;  // a string, or [{"role": "assistant", "content": ...}]
  std::vector<std::vector<int32_t>> completion_ids;  // up to and including EOS
  // Every other dataset column (solution, ...), one value per completion, in the dataset's column order.
  std::vector<std::pair<std::string, std::vector<nlohmann::ordered_json>>> columns;
  int64_t batch = 0;  // which generation round this is (1, 2, ...): error messages name it

  size_t size() const { return completions.size(); }
  // The text of completion i (its content when conversational).
  std::string completion_text(size_t i) const;
  // Column `name`, or nullptr.
  const std::vector<nlohmann::ordered_json>* column(const std::string& name) const;
};

// One reward (or std::nullopt: TRL's None, "no opinion": left out of the means) per completion.
using RewardFunction = std::function<std::vector<std::optional<double>>(const RewardInputs&)>;

struct NamedRewardFunction {
  std::string name;  // the metrics' rewards/<name>/mean
  RewardFunction fn;
};

struct RewardFunctionOptions {
  double exec_timeout_seconds = 120;  // exec:COMMAND: the longest wait for one batch's answer
};

// A reward function by its specification:
//   length:N                            −|N − characters| / 100 (the GRPO quick start's reward_len)
//   accuracy_reward                      1 if the completion's final answer (its last \boxed{...}, else its last
//                                        number, else its text) equals the `solution` column's (its last
//                                        \boxed{...}, else all of it) after normalising both (spaces, $, \left,
//                                        \dfrac, thousands commas; numbers compared as numbers), else 0; None when
//                                        the solution is empty
//   think_format_reward                  1 if the completion is "<think>...</think>..." with one <think>, else 0
//   soft_overlong_punishment:MAX:CACHE   0 up to MAX − CACHE tokens, then falling linearly to −1 at MAX, −1 beyond
//   regex:PATTERN                        1 if PCRE2 PATTERN matches somewhere in the completion's text, else 0
//   exec:COMMAND                         COMMAND (run once with /bin/sh -c) reads one JSON object per batch on
//                                        stdin, {"prompts": [...], "completions": [...], "completion_ids": [...],
//                                        <column>: [...]}, and answers one JSON line: an array of numbers or nulls,
//                                        one per completion
// An unknown name or a malformed argument is an error that lists these.
NamedRewardFunction reward_function(const std::string& spec, const RewardFunctionOptions& options = {});

struct RewardModel;
class Tokenizer;
// A reward model (`trl reward`'s output, or any one-label sequence-classification checkpoint) as TRL scores with one:
// the score head at the last token of the chat-rendered conversation prompt + completion (chat_template_kwargs
// applied), or of the text prompt + completion, tokenized without special tokens by the reward model's tokenizer.
// Named after its folder (rewards/<name>/mean).
NamedRewardFunction reward_model_function(std::shared_ptr<const RewardModel> model, std::shared_ptr<const Tokenizer> tokenizer,
                                          const std::string& name, nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object());

// A reward_funcs entry: a model folder (with config.json) or a local-cache id that resolves to one is a reward
// model (loaded with `options`, its own tokenizer), anything else reward_function(spec).
NamedRewardFunction reward_from_spec(const std::string& spec, const RewardFunctionOptions& options = {}, bool bf16 = false,
                                     nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object());

}  // namespace trl

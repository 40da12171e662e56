// Shape policy (docs/COMPILER.md, docs/TRAINING.md): `pad_to_multiple_of` and the bucket lengths a run compiles programs for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trl {

// The bucket of pad_to_multiple_of = "auto" on a backend. Neuron-style backends, whose compiles take minutes, use
// 128. The CPU backend compiles a full-depth Qwen3-0.6B training program in about 0.1 s, so it uses a finer 64:
// less padding for the same handful of programs, and one query block of its attention kernel.
int64_t auto_pad_multiple(const std::string& backend);

// Parses pad_to_multiple_of as TRL spells it: "None" (or "none", "null", "") = no bucketing (0), "auto", or a
// positive integer. Anything else is an error naming the option.
int64_t parse_pad_to_multiple_of(const std::string& value, const std::string& backend);

// The padded length of a sequence of `length` tokens: the next multiple, capped at max_length (0 = uncapped).
int64_t padded_length(int64_t length, int64_t multiple, int64_t max_length = 0);

// Every padded length a run with this policy can produce for sequences of 1..max_length tokens.
std::vector<int64_t> bucket_lengths(int64_t max_length, int64_t multiple);

}  // namespace trl

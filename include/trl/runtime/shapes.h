// Shape policy (docs/COMPILER.md, docs/TRAINING.md): `pad_to_multiple_of` and the bucket lengths a run compiles programs for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trl {

// Parses pad_to_multiple_of as TRL spells it: "None" (or "none", "null", "") = no bucketing (0), "auto" (the
// backend's bucket, Backend::auto_pad_multiple(), passed as `auto_multiple`), or a positive integer. Anything
// else is an error naming the option.
int64_t parse_pad_to_multiple_of(const std::string& value, int64_t auto_multiple);

// The padded length of a sequence of `length` tokens: the next multiple, capped at max_length (0 = uncapped).
int64_t padded_length(int64_t length, int64_t multiple, int64_t max_length = 0);

// Every padded length a run with this policy can produce for sequences of 1..max_length tokens.
std::vector<int64_t> bucket_lengths(int64_t max_length, int64_t multiple);

}  // namespace trl

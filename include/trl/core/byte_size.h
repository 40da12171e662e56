// Sizes as people write them in configs and on command lines (Transformers' max_shard_size, TRL_MEMORY_LIMIT).
#pragma once

#include <cstdint>
#include <string>

namespace trl {

// Parses sizes such as "5GB", "500MB", "100KB", "2GiB" or a plain number of bytes; anything else is an error that
// names the text and the units it takes.
uint64_t parse_byte_size(const std::string& text);

}  // namespace trl

// The tokenizer the config and dataset targets read beside their input: a cut of Qwen3's with `vocab_size` tokens
// (its pre-tokenizer, special tokens and chat template; not the 11 MB whole), written once per process in the
// target's scratch folder. Cutting takes seconds under the sanitizers: a target makes it in LLVMFuzzerInitialize, so
// the time does not count against its first input.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz_util.h"
#include "trl/models/init.h"

namespace trl::fuzz {

inline std::string tokenizer_folder(int64_t vocab_size) {
  const std::string dir = scratch() + "/tokenizer-" + std::to_string(vocab_size);
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    std::filesystem::create_directories(dir);
    trl::write_tokenizer_files(dir, vocab_size);
  }
  return dir;
}

}  // namespace trl::fuzz

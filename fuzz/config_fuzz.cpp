// libFuzzer target: the small JSON files of a model folder (docs/TESTING.md, "Fuzzing"). The first byte picks the
// file the rest is: config.json (ModelConfig, then the parameter shapes it implies), generation_config.json
// (GenerationConfig::from_model_dir), adapter_config.json (LoraConfig, then the modules it targets in a tiny Qwen3)
// or tokenizer_config.json beside a valid tokenizer.json (the special tokens and the chat template). Anything but a
// result or a trl::Error is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "tokenizer_folder.h"
#include "trl/core/error.h"
#include "trl/generation/generate.h"
#include "trl/io/model_config.h"
#include "trl/models/lora.h"
#include "trl/tokenizer/tokenizer.h"

namespace {

// tokenizer_config.json is read beside a tokenizer.json of 512 tokens (the smallest cut: each input reloads it).
constexpr int64_t kVocab = 512;

}  // namespace

#ifndef TRL_FUZZ_REGRESSION
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)trl::fuzz::tokenizer_folder(kVocab);
  return 0;
}
#endif

TRL_FUZZ_TARGET(config) {
  if (size == 0) return 0;
  const int which = data[0] % 4;
  try {
    switch (which) {
      case 0: {
        const trl::ModelConfig c = trl::ModelConfig::load(trl::fuzz::write("m/config.json", data + 1, size - 1));
        (void)c.to_json();
        break;
      }
      case 1: {
        trl::fuzz::write("g/generation_config.json", data + 1, size - 1);
        (void)trl::GenerationConfig::from_model_dir(trl::fuzz::scratch() + "/g");
        break;
      }
      case 2: {
        static const trl::ModelConfig tiny = trl::preset_config("tiny", trl::DType::F32);
        trl::fuzz::write("a/adapter_config.json", data + 1, size - 1);
        const trl::LoraConfig c = trl::read_adapter_config(trl::fuzz::scratch() + "/a");
        (void)trl::lora_target_modules(tiny, c);
        (void)c.scaling();
        break;
      }
      default: {
        const std::string dir = trl::fuzz::tokenizer_folder(kVocab);
        trl::fuzz::write_to(dir + "/tokenizer_config.json", data + 1, size - 1);
        const trl::Tokenizer tok = trl::Tokenizer::from_pretrained(dir);
        (void)tok.encode("Hello <|im_end|>", true);
        break;
      }
    }
  } catch (const trl::Error&) {
  }
  return 0;
}

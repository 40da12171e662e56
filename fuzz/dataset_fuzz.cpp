// libFuzzer target: dataset files and their rows as the trainers read them (docs/TESTING.md, "Fuzzing"). The first
// byte picks the file kind (JSON lines or a JSON array) and the reader (SFT, paired preference, unpaired preference);
// the rows are tokenized with a 4,096-token cut of the Qwen3 tokenizer and checked against that vocabulary. Anything but
// examples or a trl::Error is a finding.
#include <cstddef>
#include <cstdint>

#include "data/preference.h"
#include "fuzz_util.h"
#include "tokenizer_folder.h"
#include "trl/core/error.h"
#include "trl/data/dataset.h"
#include "trl/data/sft.h"
#include "trl/tokenizer/tokenizer.h"

namespace {

constexpr int64_t kVocab = 4096;  // the rows' ids are checked against it

const trl::Tokenizer& tokenizer() {
  static const trl::Tokenizer tok = trl::Tokenizer::from_pretrained(trl::fuzz::tokenizer_folder(kVocab));
  return tok;
}

}  // namespace

#ifndef TRL_FUZZ_REGRESSION
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)tokenizer();
  return 0;
}
#endif

TRL_FUZZ_TARGET(dataset) {
  if (size == 0) return 0;
  const trl::Tokenizer& tok = tokenizer();
  const bool lines = (data[0] & 1) == 0;
  const int reader = (data[0] >> 1) % 3;
  try {
    const trl::Dataset d = trl::load_dataset(trl::fuzz::write(lines ? "d/data.jsonl" : "d/data.json", data + 1, size - 1));
    if (reader == 0) {
      trl::SFTDataOptions o;
      o.max_length = 64;
      o.vocab_size = kVocab;
      (void)trl::prepare_sft_dataset(d, tok, o);
    } else {
      trl::PreferenceDataOptions o;
      o.max_length = 64;
      o.vocab_size = kVocab;
      if (reader == 1) (void)trl::prepare_preference_dataset(d, tok, o);
      else (void)trl::prepare_unpaired_dataset(d, tok, o);
    }
  } catch (const trl::Error&) {
  }
  return 0;
}

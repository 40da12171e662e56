// libFuzzer target: tokenizer.json (docs/TESTING.md, "Fuzzing"): the model (BPE vocab and merges), normalizers,
// pre-tokenizers, decoders, post-processor and added tokens, then an encode and a decode of fixed text with special
// tokens. Anything but a tokenizer or a trl::Error is a finding.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "trl/core/error.h"
#include "trl/tokenizer/tokenizer.h"

TRL_FUZZ_TARGET(tokenizer) {
  try {
    const trl::Tokenizer tok = trl::Tokenizer::from_file(trl::fuzz::write("tokenizer.json", data, size));
    const std::vector<int32_t> ids = tok.encode("Hello, world! 1234 <|im_end|> \xc3\xa9t\xc3\xa9  \n\tcaf\xc3\xa9", true);
    (void)tok.decode(ids, false);
    (void)tok.decode(ids, true);
    const std::vector<int32_t> odd = {0, 1, 2, 3, 100000, -1};  // ids beyond the vocabulary and negative ones
    (void)tok.decode(odd, true);
  } catch (const trl::Error&) {
  }
  return 0;
}

// libFuzzer target: dataset files and their rows as the trainers read them (docs/TESTING.md, "Fuzzing"). The first
// byte picks the file kind (JSON lines or a JSON array; plain, gzip-compressed, or damaged gzip) and the reader (SFT,
// paired preference, unpaired preference);
// the rows are tokenized with a 4,096-token cut of the Qwen3 tokenizer and checked against that vocabulary. Anything but
// examples or a trl::Error is a finding.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

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

// The bytes gzip-compressed (as a .jsonl.gz on the Hub holds them).
std::string gzipped(const uint8_t* data, size_t size) {
  z_stream z{};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
  std::string out(deflateBound(&z, size), '\0');
  z.next_in = const_cast<Bytef*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
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
  // The top 2 bits: 0-1 a plain file, 2 the rest gzip-compressed, 3 the rest as the bytes of a .gz file.
  const int gz = data[0] >> 6;
  const std::string name = std::string(lines ? "d/data.jsonl" : "d/data.json") + (gz >= 2 ? ".gz" : "");
  try {
    const std::string packed = gz == 2 ? gzipped(data + 1, size - 1) : std::string();
    const std::string file = gz == 2 ? trl::fuzz::write(name, reinterpret_cast<const uint8_t*>(packed.data()), packed.size())
                                     : trl::fuzz::write(name, data + 1, size - 1);
    const trl::Dataset d = trl::load_dataset(file);
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

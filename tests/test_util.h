// Shared test helpers.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "trl/models/causal_lm.h"
#include "core/sanitizers.h"

namespace trl {
class Tokenizer;
}

namespace trl::test {

// Built with AddressSanitizer (scripts/test.sh's second pass): the long learning tests skip themselves there.
constexpr bool kSanitized = TRL_ASAN;

// The bundled Qwen3 tokenizer, loaded once per test process.
const Tokenizer& qwen3_tokenizer();

// The cut vocabulary of the learning and distributed tests (InitOptions::vocab_size): where the vocabulary is not
// what a test checks, a tiny model's 151936-row embedding and head are nearly all of its work (20 SFT steps of the
// tiny model: 26.1 s with the whole vocabulary, 1.4 s with 4096 rows; docs/MODELS.md). cut_tokenizer() is the Qwen3
// tokenizer cut to it, loaded once per test process.
constexpr int64_t kCutVocab = 4096;
const Tokenizer& cut_tokenizer();

// A fresh directory under $TMPDIR, removed (with its contents) when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A tiny Qwen3 (preset tiny, seed 3, initializer_range 0.1) written to <dir>/model and loaded from there: the
// trainer tests' model; TinyModel(kCutVocab) has the cut vocabulary (use cut_tokenizer() with it).
struct TinyModel {
  TempDir dir;
  CausalLM model;
  explicit TinyModel(int64_t vocab_size = 0);
};

// The larger of a running worst error and a new one, where NaN wins (std::max(worst, NaN) keeps `worst`, so a NaN
// error would pass a tolerance check); nan_min is the same for a running minimum.
inline double nan_max(double worst, double x) {
  return std::isnan(worst) || std::isnan(x) ? std::numeric_limits<double>::quiet_NaN() : std::max(worst, x);
}
inline double nan_min(double best, double x) {
  return std::isnan(best) || std::isnan(x) ? std::numeric_limits<double>::quiet_NaN() : std::min(best, x);
}

// The message of the trl::Error that f throws, or "(no error)".
std::string error_of(const std::function<void()>& f);

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);
// Runs a shell command, returns its exit status; stdout+stderr go to *output when given.
int run_command(const std::string& command, std::string* output = nullptr);

// The environment prefix of an `mpirun` command line in the tests: mpirun as root (CI containers), ranks may
// outnumber cores, and under the sanitizers leak checking of every rank with Open MPI's own allocations suppressed
// (tests/data/sanitizers/openmpi-leaks.supp), so the distributed code runs in the sanitizer pass too.
std::string mpirun_env();
// The path of the running test binary (to run some of its tests again under mpirun).
std::string self_executable();

}  // namespace trl::test

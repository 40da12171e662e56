// A small, fully specified random generator. Model initialisation must give the same bytes on every machine
// and compiler (golden files depend on it), so we do not use <random>'s distributions, whose algorithms are
// implementation-defined, nor libm functions, whose last bit may differ between CPUs.
#pragma once

#include <cstdint>

namespace trl {

// SplitMix64 (Steele, Lea & Flood): a 64-bit state, one multiply-xorshift mix per draw.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // An approximately standard normal draw: the sum of four 16-bit uniforms (Irwin-Hall, n = 4), centred and
  // scaled to unit variance. Bounded to +-3.46 sigma, which suits weight initialisation; exact integer and
  // double arithmetic, so it is bit-reproducible everywhere.
  double normal() {
    uint64_t r = next();
    double sum = 0;
    for (int i = 0; i < 4; ++i) {
      sum += (static_cast<double>(r & 0xffffu) + 0.5) / 65536.0;
      r >>= 16;
    }
    return (sum - 2.0) * 1.7320508075688772;  // variance of the sum is 4/12 -> scale by sqrt(3)
  }

 private:
  uint64_t state_;
};

// Dropout's mask (graph::Op::Dropout): element `index` of stream `stream` under `seed` is kept unless a hash of the
// three falls below p·2³². Counter-based, so any backend, thread split or recomputation draws the same mask.
inline uint32_t dropout_threshold(double p) { return static_cast<uint32_t>(p * 4294967296.0); }
inline bool dropout_keep(uint64_t seed, int64_t stream, int64_t index, uint32_t threshold) {
  uint64_t z = seed ^ (static_cast<uint64_t>(stream) * 0xd1b54a32d192ed03ull) ^ (static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z >> 32) >= threshold;
}
// The seed [2] i32 input of a dropout op as one 64-bit value.
inline uint64_t dropout_seed(const int32_t* s) { return static_cast<uint64_t>(static_cast<uint32_t>(s[0])) << 32 | static_cast<uint32_t>(s[1]); }

}  // namespace trl

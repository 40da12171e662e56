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

}  // namespace trl

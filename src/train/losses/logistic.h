// The logistic function and its logarithm in double precision, stable for any |x|: the preference losses' (DPO, KTO,
// reward) scalar math on the host.
#pragma once

#include <algorithm>
#include <cmath>

namespace trl::logistic {

// σ(x) = 1 / (1 + e^(−x)); e^x / (1 + e^x) for negative x, so that e^(−x) never overflows.
inline double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

// log σ(x) = −log(1 + e^(−x)) = min(x, 0) − log1p(e^(−|x|)).
inline double log_sigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::fabs(x))); }

}  // namespace trl::logistic

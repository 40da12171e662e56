// Wall-clock intervals for logs and reports (never for a test's assertion).
#pragma once

#include <chrono>

namespace trl {

// Seconds from t until now.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace trl

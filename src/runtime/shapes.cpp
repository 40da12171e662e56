#include "trl/runtime/shapes.h"

#include <algorithm>
#include <cctype>

#include "trl/core/error.h"

namespace trl {

int64_t parse_pad_to_multiple_of(const std::string& value, int64_t auto_multiple) {
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v.empty() || v == "none" || v == "null") return 0;
  if (v == "auto") return auto_multiple;
  int64_t n = 0;
  size_t i = 0;
  for (; i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])) && n < (int64_t{1} << 40); ++i) n = n * 10 + (v[i] - '0');
  if (i != v.size() || n <= 0) fail("pad_to_multiple_of: '{}' is not None, \"auto\" or a positive integer", value);
  return n;
}

int64_t padded_length(int64_t length, int64_t multiple, int64_t max_length) {
  int64_t out = multiple > 0 ? (length + multiple - 1) / multiple * multiple : length;
  if (max_length > 0) out = std::min(out, std::max(length, max_length));
  return out;
}

std::vector<int64_t> bucket_lengths(int64_t max_length, int64_t multiple) {
  if (max_length <= 0) fail("bucket_lengths: max_length must be positive, got {}", max_length);
  std::vector<int64_t> out;
  if (multiple <= 0) {
    for (int64_t t = 1; t <= max_length; ++t) out.push_back(t);
    return out;
  }
  for (int64_t t = multiple; t < max_length + multiple; t += multiple) out.push_back(std::min(t, max_length));
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace trl

#include "trl/core/byte_size.h"

#include <cctype>

#include "trl/core/error.h"

namespace trl {

uint64_t parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) fail("invalid size '{}': expected a number with an optional unit (KB, MB, GB, KiB, MiB, GiB)", text);
  double value = 0;
  try {
    value = std::stod(text.substr(0, i));
  } catch (...) {
    fail("invalid size '{}'", text);
  }
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "KIB") mult = 1024.0;
  else if (unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else fail("invalid size '{}': unknown unit '{}' (use KB, MB, GB, KiB, MiB or GiB)", text, text.substr(i));
  return static_cast<uint64_t>(value * mult);
}

}  // namespace trl

#include "core/json_text.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <utf8proc.h>

namespace trl {

namespace {

// The offset of the first byte that does not start a valid UTF-8 sequence, or npos.
size_t first_invalid_utf8(std::string_view text) {
  size_t at = 0;
  while (at < text.size()) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at), static_cast<utf8proc_ssize_t>(text.size() - at), &cp);
    if (n <= 0) return at;
    at += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

// "line L, column C" of offset `at` (both 1-based; columns count bytes).
std::string line_and_column(std::string_view text, size_t at) {
  at = std::min(at, text.size());
  const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
  const size_t start = at == 0 ? 0 : text.rfind('\n', at - 1);
  const size_t column = start == std::string_view::npos ? at + 1 : at - start;
  return fmt::format("line {}, column {}", line, column);
}

// Up to 24 printable characters before `at` on its line, for "after '...'".
std::string before(std::string_view text, size_t at) {
  size_t from = at > 24 ? at - 24 : 0;
  const size_t nl = text.rfind('\n', at == 0 ? 0 : at - 1);
  if (nl != std::string_view::npos && nl + 1 > from && nl < at) from = nl + 1;
  std::string out;
  for (size_t i = from; i < at; ++i) out += (static_cast<unsigned char>(text[i]) < 0x20) ? ' ' : text[i];
  return out;
}

}  // namespace

std::string describe_json_error(std::string_view text, size_t byte) {
  const size_t at = byte == 0 ? 0 : byte - 1;  // the offset of the character the parser stopped at
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return "line 1, column 1: the text is empty (no JSON value)";
  const size_t bad = first_invalid_utf8(text);
  if (bad != std::string_view::npos && bad <= at)
    return fmt::format("{}: a byte that is not UTF-8 (0x{:02x}); JSON text is UTF-8", line_and_column(text, bad), static_cast<unsigned char>(text[bad]));
  if (at >= text.size() || (at + 1 >= text.size() && text.find_first_not_of(" \t\r\n", at + 1) == std::string_view::npos &&
                            (text[at] == '\n' || text[at] == ' ' || text[at] == '\r' || text[at] == '\t')))
    return fmt::format("{}: the text ends inside a value (a truncated file or line?)", line_and_column(text, text.size()));
  const unsigned char c = static_cast<unsigned char>(text[at]);
  const std::string shown = c < 0x20 ? fmt::format("control character 0x{:02x}", c) : fmt::format("'{}'", static_cast<char>(c));
  const std::string context = before(text, at);
  return fmt::format("{}: unexpected {}{}", line_and_column(text, at), shown, context.empty() ? std::string() : " after '" + context + "'");
}

namespace {
template <class Json>
std::string kind_of(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "a whole number";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

template <class Json>
std::string shown(const Json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}
}  // namespace

std::string json_kind(const nlohmann::json& value) { return kind_of(value); }
std::string json_kind(const nlohmann::ordered_json& value) { return kind_of(value); }

template <class T, class Json>
T json_field(const Json& object, const std::string& key, const std::string& where) {
  if (!object.is_object()) fail("{}: expected a JSON object, got {}", where, kind_of(object));
  const auto it = object.find(key);
  if (it == object.end()) fail("{}: field '{}' is missing", where, key);
  const Json& v = *it;
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) return v.template get<bool>();
    fail("{}: field '{}' must be true or false, got {} ({})", where, key, shown(v), kind_of(v));
  } else if constexpr (std::is_integral_v<T>) {
    // In T's range, or an error (found by fuzzing: 4.5e24 written as a whole number was cast to int64 unchecked).
    const auto out_of_range = [&]() -> T {
      fail("{}: field '{}' = {} is out of range (the limit is {} to {})", where, key, shown(v), std::numeric_limits<T>::min(),
           std::numeric_limits<T>::max());
    };
    if (v.is_number_unsigned()) {
      const uint64_t u = v.template get<uint64_t>();
      return u <= static_cast<uint64_t>(std::numeric_limits<T>::max()) ? static_cast<T>(u) : out_of_range();
    }
    if (v.is_number_integer()) {
      const int64_t i = v.template get<int64_t>();
      if constexpr (std::is_signed_v<T>) {
        return i >= std::numeric_limits<T>::min() && i <= std::numeric_limits<T>::max() ? static_cast<T>(i) : out_of_range();
      } else {
        return i >= 0 && static_cast<uint64_t>(i) <= std::numeric_limits<T>::max() ? static_cast<T>(i) : out_of_range();
      }
    }
    if (v.is_number_float()) {
      const double d = v.template get<double>();
      if (d != std::trunc(d)) fail("{}: field '{}' must be a whole number, got {} ({})", where, key, shown(v), kind_of(v));
      // [min, max] of T as doubles: 2^63 itself is out of an int64's range, so the upper bound is exclusive.
      const double lo = static_cast<double>(std::numeric_limits<T>::min()), hi = static_cast<double>(std::numeric_limits<T>::max());
      return d >= lo && d < hi + (hi >= 9.2e18 ? 0.0 : 1.0) ? static_cast<T>(d) : out_of_range();
    }
    fail("{}: field '{}' must be a whole number, got {} ({})", where, key, shown(v), kind_of(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    if (v.is_number()) return v.template get<T>();
    fail("{}: field '{}' must be a number, got {} ({})", where, key, shown(v), kind_of(v));
  } else {
    static_assert(std::is_same_v<T, std::string>, "json_field reads bool, whole numbers, numbers and strings");
    if (v.is_string()) return v.template get<std::string>();
    fail("{}: field '{}' must be a string, got {} ({})", where, key, shown(v), kind_of(v));
  }
}

template int64_t json_field<int64_t>(const nlohmann::json&, const std::string&, const std::string&);
template int64_t json_field<int64_t>(const nlohmann::ordered_json&, const std::string&, const std::string&);
template int32_t json_field<int32_t>(const nlohmann::json&, const std::string&, const std::string&);
template int32_t json_field<int32_t>(const nlohmann::ordered_json&, const std::string&, const std::string&);
template uint64_t json_field<uint64_t>(const nlohmann::json&, const std::string&, const std::string&);
template uint64_t json_field<uint64_t>(const nlohmann::ordered_json&, const std::string&, const std::string&);
template double json_field<double>(const nlohmann::json&, const std::string&, const std::string&);
template double json_field<double>(const nlohmann::ordered_json&, const std::string&, const std::string&);
template bool json_field<bool>(const nlohmann::json&, const std::string&, const std::string&);
template bool json_field<bool>(const nlohmann::ordered_json&, const std::string&, const std::string&);
template std::string json_field<std::string>(const nlohmann::json&, const std::string&, const std::string&);
template std::string json_field<std::string>(const nlohmann::ordered_json&, const std::string&, const std::string&);

}  // namespace trl

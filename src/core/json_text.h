// JSON from outside (a file, a dataset line, an option's value) parsed and read with errors in trl.cpp's words:
// where (the file and line, or the option), the line and column in the text, and what was wrong, never the
// library's message. Every reader of outside JSON goes through these.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "trl/core/error.h"

namespace trl {

// What is wrong at `byte` (the parser's position, 1-based: the last character it read) of `text`:
// "line 3, column 7: the text ends inside a value (a truncated file?)", "...: a byte that is not UTF-8 (JSON text
// is UTF-8)", "...: unexpected '}' after '{"a": 1,'".
std::string describe_json_error(std::string_view text, size_t byte);

// Parses `text`; an error reads "<where>: not valid JSON at line L, column C: ...".
template <class Json = nlohmann::json>
Json parse_json(std::string_view text, const std::string& where) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: not valid JSON at {}", where, describe_json_error(text, e.byte));
  } catch (const nlohmann::json::exception&) {  // out_of_range: a number beyond a double (found by fuzzing)
    fail("{}: not valid JSON: a number too large to represent (beyond 1.8e308)", where);
  }
}

// The name of a JSON value's kind as the messages say it: "a string", "a number", "null", ...
std::string json_kind(const nlohmann::json& value);
std::string json_kind(const nlohmann::ordered_json& value);

// A field of a JSON object read as T (int64_t, double, bool, std::string), in trl's words: "<where>: field 'key'
// is missing" or "<where>: field 'key' must be a whole number, got "12a" (a string)".
template <class T, class Json>
T json_field(const Json& object, const std::string& key, const std::string& where);

}  // namespace trl

// JSON from outside read in trl.cpp's words (src/core/json_text.h): where, the line and column, and what was wrong;
// never the library's message (issue 37, defect 7).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "test_util.h"

namespace trl {
namespace {

std::string parse_error(const std::string& text) {
  return test::error_of([&] { (void)parse_json(text, "f.json"); });
}

TEST(JsonText, ParseErrorsSayWhereAndWhatInOurWords) {
  const std::string truncated = parse_error("{\n  \"a\": [1, 2");
  EXPECT_NE(truncated.find("f.json: not valid JSON at line 2, column 13: the text ends inside a value (a truncated file or line?)"), std::string::npos)
      << truncated;
  const std::string bad_utf8 = parse_error("{\"a\": \"caf\xe9\"}");
  EXPECT_NE(bad_utf8.find("line 1, column 11: a byte that is not UTF-8 (0xe9); JSON text is UTF-8"), std::string::npos) << bad_utf8;
  const std::string unexpected = parse_error("{\"a\": 1,\n \"b\": 2,}");
  EXPECT_NE(unexpected.find("line 2, column 9: unexpected '}' after ' \"b\": 2,'"), std::string::npos) << unexpected;
  EXPECT_NE(parse_error("  \n").find("the text is empty"), std::string::npos);
  // A number beyond a double is the library's out_of_range, not a parse error (found by fuzzing the checkpoint reader).
  EXPECT_NE(parse_error("{\"x\": 1e400}").find("f.json: not valid JSON: a number too large to represent"), std::string::npos);
  for (const std::string& e : {truncated, bad_utf8, unexpected}) EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
}

TEST(JsonText, FieldsSayWhatTheyMustBe) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(R"({"n": "12a", "f": 2.5, "w": 3.0, "b": 1, "s": [1]})");
  EXPECT_NE(test::error_of([&] { (void)json_field<int64_t>(j, "n", "state.json"); }).find("state.json: field 'n' must be a whole number, got \"12a\" (a string)"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { (void)json_field<int64_t>(j, "f", "state.json"); }).find("must be a whole number, got 2.5 (a number)"), std::string::npos);
  EXPECT_EQ(json_field<int64_t>(j, "w", "state.json"), 3);  // 3.0 is a whole number
  EXPECT_DOUBLE_EQ(json_field<double>(j, "f", "state.json"), 2.5);
  EXPECT_NE(test::error_of([&] { (void)json_field<bool>(j, "b", "state.json"); }).find("field 'b' must be true or false, got 1"), std::string::npos);
  EXPECT_NE(test::error_of([&] { (void)json_field<std::string>(j, "s", "state.json"); }).find("must be a string, got [1] (a list)"), std::string::npos);
  EXPECT_NE(test::error_of([&] { (void)json_field<double>(j, "missing", "state.json"); }).find("state.json: field 'missing' is missing"), std::string::npos);
  // Whole numbers beyond the field's type are errors, never a cast out of range (found by fuzzing: 4.5e24 as int64).
  const nlohmann::ordered_json big = nlohmann::ordered_json::parse(
      R"({"f": 4555555555555555555555555, "g": 9223372036854775808.0, "u": 18446744073709551615, "i": 3000000000, "m": -1, "lo": -9223372036854775808.0, "inf": 1e308})");
  for (const char* key : {"f", "g", "u", "inf"})
    EXPECT_NE(test::error_of([&] { (void)json_field<int64_t>(big, key, "state.json"); }).find("is out of range (the limit is -9223372036854775808 to 9223372036854775807)"),
              std::string::npos) << key;
  EXPECT_EQ(json_field<int64_t>(big, "lo", "state.json"), INT64_MIN);
  EXPECT_EQ(json_field<int64_t>(big, "i", "state.json"), 3000000000);
  EXPECT_NE(test::error_of([&] { (void)json_field<int32_t>(big, "i", "config.json"); }).find("field 'i' = 3000000000 is out of range"), std::string::npos);
  EXPECT_NE(test::error_of([&] { (void)json_field<uint64_t>(big, "m", "config.json"); }).find("field 'm' = -1 is out of range"), std::string::npos);
  EXPECT_EQ(json_field<uint64_t>(big, "u", "state.json"), UINT64_MAX);
}

}  // namespace
}  // namespace trl

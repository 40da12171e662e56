#include "trl/runtime/shapes.h"

#include <gtest/gtest.h>

#include "trl/core/error.h"

namespace trl {
namespace {

TEST(Shapes, PadToMultipleOfParsesTrlSpellings) {
  EXPECT_EQ(parse_pad_to_multiple_of("None", 64), 0);
  EXPECT_EQ(parse_pad_to_multiple_of("", 64), 0);
  EXPECT_EQ(parse_pad_to_multiple_of("auto", 64), 64);
  EXPECT_EQ(parse_pad_to_multiple_of("auto", 128), 128);
  EXPECT_EQ(parse_pad_to_multiple_of("128", 64), 128);
  for (const char* bad : {"0", "-8", "12x", "many", "99999999999999999999"}) {
    try {
      parse_pad_to_multiple_of(bad, 64);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pad_to_multiple_of"), std::string::npos);
    }
  }
}

TEST(Shapes, PaddedLengthsAndBuckets) {
  EXPECT_EQ(padded_length(1, 128), 128);
  EXPECT_EQ(padded_length(128, 128), 128);
  EXPECT_EQ(padded_length(129, 128), 256);
  EXPECT_EQ(padded_length(129, 0), 129);
  EXPECT_EQ(padded_length(300, 128, 320), 320);  // capped at max_length, never below the length
  EXPECT_EQ(bucket_lengths(512, 128), (std::vector<int64_t>{128, 256, 384, 512}));
  EXPECT_EQ(bucket_lengths(320, 128), (std::vector<int64_t>{128, 256, 320}));
  EXPECT_EQ(bucket_lengths(3, 0), (std::vector<int64_t>{1, 2, 3}));
  // Every length 1..max maps into the bucket list.
  const auto buckets = bucket_lengths(1000, 64);
  for (int64_t t = 1; t <= 1000; ++t)
    EXPECT_NE(std::find(buckets.begin(), buckets.end(), padded_length(t, 64, 1000)), buckets.end()) << t;
}

}  // namespace
}  // namespace trl

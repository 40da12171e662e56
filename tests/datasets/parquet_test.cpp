// The Parquet reader against fixtures written by hyparquet-writer (pages v2) and @dsnp/parquetjs (pages v1), whose
// rows as read by hyparquet are committed beside them (tests/reference/parquet_fixtures.mjs): every row of every
// fixture must be equal. Then malformed files: every one is a trl::Error that names the file, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "trl/core/error.h"
#include "trl/data/parquet.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;
const std::string kDir = std::string(TRL_TEST_DATA_DIR) + "/parquet/";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<ojson> read_all(const parquet::File& f) {
  std::vector<ojson> rows;
  for (int g = 0; g < f.num_row_groups(); ++g)
    for (auto& r : f.read_row_group(g)) rows.push_back(std::move(r));
  return rows;
}

// JSON equality with numbers compared as doubles (hyparquet's JSON writes 2.0 as 2), NaN never equal.
bool same(const ojson& a, const ojson& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!same(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    auto ia = a.begin();
    auto ib = b.begin();
    for (; ia != a.end(); ++ia, ++ib)  // same keys in the same order (the schema's)
      if (ia.key() != ib.key() || !same(ia.value(), ib.value())) return false;
    return true;
  }
  return a == b;
}

class ParquetFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ParquetFixture, EveryRowEqualsHyparquets) {
  const std::string name = GetParam();
  const parquet::File f = parquet::File::open(kDir + name + ".parquet");
  const ojson want = ojson::parse(slurp(kDir + name + ".json"));
  ASSERT_TRUE(want.is_array());
  ASSERT_GT(want.size(), 0u);
  const std::vector<ojson> got = read_all(f);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(f.num_rows(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(same(got[i], want[i])) << name << " row " << i << "\n got " << got[i].dump() << "\nwant " << want[i].dump();
}

INSTANTIATE_TEST_SUITE_P(All, ParquetFixture,
                         ::testing::Values("types_uncompressed", "types_snappy", "types_gzip", "types_zstd", "encodings_dictionary", "encodings_plain",
                                           "encodings_delta", "capybara", "preference", "prompt_only", "maps_and_nested_lists", "v1_uncompressed", "v1_snappy", "v1_gzip"));

TEST(Parquet, FixturesHaveSeveralRowGroups) {
  for (const char* name : {"types_snappy", "capybara", "v1_gzip", "encodings_delta"}) {
    const parquet::File f = parquet::File::open(kDir + name + ".parquet");
    EXPECT_GT(f.num_row_groups(), 1) << name;
    int64_t rows = 0;
    for (int g = 0; g < f.num_row_groups(); ++g) {
      EXPECT_EQ(static_cast<int64_t>(f.read_row_group(g).size()), f.row_group_rows(g));
      rows += f.row_group_rows(g);
    }
    EXPECT_EQ(rows, f.num_rows());
  }
}

TEST(Parquet, ColumnTypesReadLikeDatasetsFeatures) {
  const parquet::File f = parquet::File::open(kDir + "capybara.parquet");
  const auto cols = f.columns();
  ASSERT_EQ(cols.size(), 2u);
  EXPECT_EQ(cols[0].name, "source");
  EXPECT_EQ(cols[0].type, "string");
  EXPECT_EQ(cols[1].name, "messages");
  EXPECT_EQ(cols[1].type, "list<struct<content: string, role: string>>");
  const parquet::File t = parquet::File::open(kDir + "types_zstd.parquet");
  std::string all;
  for (const auto& c : t.columns()) all += c.name + ": " + c.type + "; ";
  EXPECT_EQ(all,
            "id: int32; big: int64; text: string; maybe: string; flag: bool; score: float; weight: double; ints: list<int32>; "
            "pair: struct<a: int32, b: string>; messages: list<struct<content: string, role: string>>; ");
  const parquet::File v1 = parquet::File::open(kDir + "v1_snappy.parquet");
  EXPECT_EQ(v1.columns()[6].type, "list<struct<content: string, role: string>>");  // a bare repeated group
}

// The message of the trl::Error that reading `bytes` throws ("" if it reads fine); anything else fails the test.
std::string read_error(const std::string& bytes, parquet::ReadLimits limits = {}) {
  try {
    const parquet::File f = parquet::File::from_bytes(bytes, "bad.parquet", limits);
    read_all(f);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(Parquet, TruncatedFilesAndBadMagicAreErrorsNamingTheFile) {
  const std::string good = slurp(kDir + "capybara.parquet");
  EXPECT_NE(read_error(good.substr(0, 10)).find("bad.parquet: not a Parquet file"), std::string::npos);
  EXPECT_NE(read_error(good.substr(0, good.size() - 1)).find("no \"PAR1\" magic at the end"), std::string::npos);
  std::string magic = good;
  magic[1] = 'X';
  EXPECT_NE(read_error(magic).find("no \"PAR1\" magic at the start"), std::string::npos);
  std::string footer = good;
  footer[footer.size() - 6] = '\x7f';  // footer length's second byte: far past the file
  EXPECT_NE(read_error(footer).find("the footer claims"), std::string::npos);
  // Every cut point: an error (the footer is gone or corrupt), never a crash.
  for (size_t n = 0; n < good.size(); n += 7) EXPECT_NE(read_error(good.substr(0, n)), "") << n;
}

TEST(Parquet, CorruptPagesNameTheRowGroupAndColumn) {
  // Flip every byte of the column data (before the footer) in turn: each read either succeeds with other values or
  // fails with an error naming the file, row group and column; none crashes (this test also runs under ASan/UBSan).
  const std::string good = slurp(kDir + "types_snappy.parquet");
  uint32_t footer_len;
  std::memcpy(&footer_len, good.data() + good.size() - 8, 4);
  const size_t data_end = good.size() - 8 - footer_len;
  int errors = 0, named = 0;
  for (size_t i = 4; i < data_end; i += 3) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    const std::string e = read_error(bad);
    if (e.empty()) continue;
    ++errors;
    EXPECT_EQ(e.rfind("bad.parquet: ", 0), 0u) << e;
    if (e.find("row group ") != std::string::npos && e.find("column '") != std::string::npos) ++named;
  }
  EXPECT_GT(errors, 100);
  EXPECT_EQ(named, errors);
}

TEST(Parquet, CorruptFootersAreErrors) {
  const std::string good = slurp(kDir + "v1_snappy.parquet");
  uint32_t footer_len;
  std::memcpy(&footer_len, good.data() + good.size() - 8, 4);
  int errors = 0;
  for (size_t i = good.size() - 8 - footer_len; i < good.size() - 8; ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x21);
    const std::string e = read_error(bad);
    if (!e.empty()) {
      ++errors;
      EXPECT_EQ(e.rfind("bad.parquet: ", 0), 0u) << e;
    }
  }
  EXPECT_GT(errors, 10);
}

TEST(Parquet, LimitsStopRowGroupsThatExpandTooFar) {
  parquet::ReadLimits small;
  small.max_values_per_row_group = 20;
  const std::string e = read_error(slurp(kDir + "types_gzip.parquet"), small);
  EXPECT_NE(e.find("max_values_per_row_group"), std::string::npos) << e;
  parquet::ReadLimits pages;
  pages.max_page_bytes = 16;
  EXPECT_NE(read_error(slurp(kDir + "types_gzip.parquet"), pages).find("past the limit of 16 bytes per page"), std::string::npos);
}

// A file whose footer is `footer` (PAR1, footer, length, PAR1).
std::string with_footer(const std::string& footer) {
  std::string f = "PAR1" + footer;
  const auto n = static_cast<uint32_t>(footer.size());
  f.append(reinterpret_cast<const char*>(&n), 4);
  return f + "PAR1";
}

TEST(Parquet, DeeplyNestedThriftIsAnErrorNotAStackOverflow) {
  // Field 5 of FileMetaData as a list of lists of lists ...: skipped field, nested 200,000 deep.
  std::string nested = "\x59";
  nested.append(200000, '\x19');  // (not "\x59" + std::string(...): GCC 12 -O3 warns falsely on that, bug 105651)
  const std::string e = read_error(with_footer(nested));
  EXPECT_NE(e.find("bad.parquet: corrupt footer (FileMetaData): "), std::string::npos) << e;
  EXPECT_NE(e.find("nested deeper than 64 levels"), std::string::npos) << e;
}

TEST(Parquet, BytesOfRowsAreBounded) {
  parquet::ReadLimits small;
  small.max_bytes_per_row_group = 2000;
  const std::string e = read_error(slurp(kDir + "capybara.parquet"), small);
  EXPECT_NE(e.find("row group 0, column '"), std::string::npos) << e;
  EXPECT_NE(e.find("max_bytes_per_row_group"), std::string::npos) << e;
  parquet::ReadLimits footer;
  footer.max_footer_bytes = 100;
  EXPECT_NE(read_error(slurp(kDir + "capybara.parquet"), footer).find("ReadLimits::max_footer_bytes"), std::string::npos);
}

TEST(Parquet, StringsThatAreNotUtf8AreErrors) {
  std::string bytes = slurp(kDir + "types_uncompressed.parquet");
  size_t replaced = 0;
  for (size_t at = bytes.find("Qwen"); at != std::string::npos; at = bytes.find("Qwen", at + 1)) bytes[at + 1] = '\xFF', ++replaced;
  ASSERT_GT(replaced, 0u);
  const std::string e = read_error(bytes);
  EXPECT_NE(e.find("not valid UTF-8"), std::string::npos) << e;
  EXPECT_NE(e.find("column '"), std::string::npos) << e;
}

// The fuzz corpus (fuzz/corpus/parquet: the seeds and every finding, kept as regression inputs): each file reads or
// fails with a trl::Error; under the sanitizer pass, without a report.
TEST(Parquet, FuzzCorpusReadsOrFailsCleanly) {
  parquet::ReadLimits limits;  // the fuzz target's
  limits.max_page_bytes = int64_t{1} << 22;
  limits.max_values_per_row_group = int64_t{1} << 18;
  limits.max_bytes_per_row_group = int64_t{1} << 26;
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(TRL_TEST_DATA_DIR) + "/../../fuzz/corpus/parquet")) {
    read_error(slurp(e.path().string()), limits);
    ++files;
  }
  EXPECT_GT(files, 10);
}

TEST(Parquet, MissingFileIsAnError) {
  try {
    parquet::File::open(kDir + "no-such.parquet");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such.parquet: cannot open"), std::string::npos);
  }
}

}  // namespace
}  // namespace trl

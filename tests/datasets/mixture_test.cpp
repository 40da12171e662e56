// TRL's dataset mixtures (a YAML config's `datasets:`): entries read as TRL's DatasetConfig, shares as TRL's
// get_dataset computes them, columns chosen, data_dir and data_files, and the train/test split.
#include "trl/data/mixture.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "test_util.h"

namespace trl {
namespace {

using json = nlohmann::json;

// n rows {"extra": 1, "id": i, "text": "<name>-<i>"} (keys sorted, as nlohmann::json writes them).
void write_rows(const std::string& path, const std::string& name, int n) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::string rows;
  for (int i = 0; i < n; ++i) rows += json{{"text", name + "-" + std::to_string(i)}, {"id", i}, {"extra", 1}}.dump() + "\n";
  test::write_file(path, rows);
}

std::vector<std::string> texts(const Dataset& d) {
  std::vector<std::string> out;
  for (size_t i = 0; i < d.size(); ++i) out.push_back(d.row(i)["text"].get<std::string>());
  return out;
}

DatasetMixture mixture(const std::string& yaml_as_json) { return parse_dataset_mixture(json::parse(yaml_as_json), "c.yaml"); }

TEST(DatasetMixture, SharesFollowTrlsGetDataset) {
  test::TempDir dir;
  write_rows(dir.file("a.jsonl"), "a", 10);
  write_rows(dir.file("b.jsonl"), "b", 4);
  // No fractions: everything, concatenated in order.
  auto all = load_dataset_mixture(mixture(R"([{"path": ")" + dir.file("a.jsonl") + R"("}, {"path": ")" + dir.file("b.jsonl") + R"("}])"), 0);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all.at("train").size(), 14u);
  EXPECT_EQ(texts(all.at("train"))[10], "b-0");
  EXPECT_EQ(all.at("train").location(10), dir.file("b.jsonl") + ":1");  // rows remember their file
  // 0.75 / 0.25: total = min(10 / 0.75, 4 / 0.25) = 13.33; round(10.0) = 10 rows of a, round(3.33) = 3 of b.
  auto shares = load_dataset_mixture(mixture(R"([{"path": ")" + dir.file("a.jsonl") + R"(", "fraction": 3}, {"path": ")" + dir.file("b.jsonl") +
                                             R"(", "fraction": 1}])"),
                                     0);
  const std::vector<std::string> t = texts(shares.at("train"));
  ASSERT_EQ(t.size(), 13u);
  EXPECT_EQ(t[9], "a-9");
  EXPECT_EQ(t[12], "b-2");
  // 0.5 / 0.5: total = min(20, 8) = 8: the first 4 rows of each.
  auto halves = load_dataset_mixture(mixture(R"([{"path": ")" + dir.file("a.jsonl") + R"(", "fraction": 0.5}, {"path": ")" + dir.file("b.jsonl") +
                                             R"(", "fraction": 0.5}])"),
                                     0);
  EXPECT_EQ(texts(halves.at("train")), (std::vector<std::string>{"a-0", "a-1", "a-2", "a-3", "b-0", "b-1", "b-2", "b-3"}));
  // Shares too large to add up are scaled first: 1e308 and 1e308 are halves.
  auto huge = load_dataset_mixture(mixture(R"([{"path": ")" + dir.file("a.jsonl") + R"(", "fraction": 1e308}, {"path": ")" + dir.file("b.jsonl") +
                                           R"(", "fraction": 1e308}])"),
                                   0);
  EXPECT_EQ(huge.at("train").size(), 8u);
  // A share of 0 takes nothing from that dataset and does not bound the others.
  auto zero = load_dataset_mixture(mixture(R"([{"path": ")" + dir.file("a.jsonl") + R"(", "fraction": 1}, {"path": ")" + dir.file("b.jsonl") +
                                           R"(", "fraction": 0}])"),
                                   0);
  EXPECT_EQ(zero.at("train").size(), 10u);
}

TEST(DatasetMixture, ColumnsDataDirDataFilesAndTheTestSplit) {
  test::TempDir dir;
  write_rows(dir.file("ds/en/train.jsonl"), "en", 6);
  write_rows(dir.file("ds/fr/train.jsonl"), "fr", 3);
  write_rows(dir.file("ds/fr/extra.jsonl"), "fx", 2);
  const std::string ds = dir.file("ds");
  auto m = load_dataset_mixture(mixture(R"([{"path": ")" + ds + R"(", "data_dir": "en", "columns": ["text"]},
                                             {"path": ")" + ds + R"(", "data_files": ["fr/extra.jsonl"]},
                                             {"path": ")" + ds + R"(", "data_files": {"train": "fr/train*"}, "columns": "id"}])"),
                                0);
  const Dataset& train = m.at("train");
  ASSERT_EQ(train.size(), 11u);
  EXPECT_EQ(train.row(0), nlohmann::ordered_json({{"text", "en-0"}}));  // only the chosen column
  EXPECT_EQ(train.row(6)["text"], "fx-0");
  EXPECT_EQ(train.row(6).size(), 3u);
  EXPECT_EQ(train.row(10), nlohmann::ordered_json({{"id", 2}}));
  // test_split_size: a fraction (rounded up) or a number of rows; a seeded shuffle, the same for the same seed.
  DatasetMixture split = mixture(R"([{"path": ")" + ds + R"(", "data_dir": "en"}, {"path": ")" + ds + R"(", "data_dir": "fr"}])");
  split.test_split_size = 0.25;  // 6 + 3 rows (fr/extra.jsonl names no split); ceil(0.25 * 9) = 3
  auto s1 = load_dataset_mixture(split, 7), s2 = load_dataset_mixture(split, 7), s3 = load_dataset_mixture(split, 8);
  EXPECT_EQ(s1.at("train").size(), 6u);
  EXPECT_EQ(s1.at("test").size(), 3u);
  EXPECT_EQ(texts(s1.at("test")), texts(s2.at("test")));
  std::set<std::string> seen;
  for (const auto& x : texts(s1.at("train"))) seen.insert(x);
  for (const auto& x : texts(s1.at("test"))) seen.insert(x);
  EXPECT_EQ(seen.size(), 9u) << "every row in exactly one split";
  EXPECT_NE(texts(s1.at("train")), texts(s3.at("train"))) << "another seed, another shuffle";
  split.test_split_size = 4;
  EXPECT_EQ(load_dataset_mixture(split, 0).at("test").size(), 4u);
  split.test_split_size = 9;
  EXPECT_NE(test::error_of([&] { load_dataset_mixture(split, 0); }).find("test_split_size 9 makes a test split of 9 of the mixture's 9 rows, leaving 0"),
            std::string::npos);
  split.test_split_size = 1.5;
  EXPECT_NE(test::error_of([&] { load_dataset_mixture(split, 0); }).find("neither a fraction in (0, 1) nor a whole number"), std::string::npos);
}

TEST(DatasetMixture, WrongEntriesAreNamed) {
  test::TempDir dir;
  write_rows(dir.file("a.jsonl"), "a", 2);
  const std::string a = dir.file("a.jsonl");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"path": "x"})", "c.yaml: datasets must be a list of datasets"},
      {R"([])", "c.yaml: datasets must be a list of datasets"},
      {R"(["x"])", "c.yaml: datasets[0]: each dataset is a mapping with a path"},
      {R"([{"name": "x"}])", "c.yaml: datasets[0]: 'path' is required"},
      {R"([{"path": "a", "spilt": "train"}])", "c.yaml: datasets[0]: unknown field 'spilt'"},
      {R"([{"path": "a", "fraction": 0.5}, {"path": "b"}])", "fraction must be set for either all datasets in the mixture or none of them (1 of 2"},
      {R"([{"path": "a", "fraction": -1}])", "c.yaml: datasets[0]: fraction must be a number >= 0"},
      {R"([{"path": "a", "columns": [1]}])", "columns must be column names"},
      {R"([{"path": "a", "data_files": 3}])", "data_files must be a path, a list of paths, or a mapping of split: paths"},
      {R"([{"path": 3}])", "'path' must be text, got 3"},
      {R"([{"path": "a", "columns": ["x", "x"]}])", "column 'x' is listed twice"},
      {R"([{"path": "a", "columns": []}])", "columns is empty"},
  };
  for (const auto& c : bad) {
    const std::string e = test::error_of([&] { mixture(c.first); });
    EXPECT_NE(e.find(c.second), std::string::npos) << c.first << " -> " << e;
  }
  std::string e = test::error_of([&] { load_dataset_mixture(mixture(R"([{"path": ")" + a + R"(", "columns": ["text", "label"]}])"), 0); });
  EXPECT_NE(e.find("column 'label' is not in " + a + ":1 (its columns: extra, id, text)"), std::string::npos) << e;
  e = test::error_of([&] { load_dataset_mixture(mixture(R"([{"path": ")" + dir.path() + R"(", "data_dir": "nope"}])"), 0); });
  EXPECT_NE(e.find("data_dir nope: no such folder"), std::string::npos) << e;
  e = test::error_of([&] { load_dataset_mixture(mixture(R"([{"path": ")" + dir.path() + R"(", "data_files": "*.parquet"}])"), 0); });
  EXPECT_NE(e.find("data_files *.parquet match no .parquet, .jsonl or .json file"), std::string::npos) << e;
}

}  // namespace
}  // namespace trl

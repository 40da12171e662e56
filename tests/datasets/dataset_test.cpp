// Finding a dataset's split (hub cache, folders, README configs, shards) and reading its rows, Parquet or JSON
// lines, the same way; and a training run on Parquet rows equals one on the same rows in JSON lines.
#include "trl/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "trl/core/error.h"
#include "trl/data/parquet.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

namespace stdfs = std::filesystem;
using ojson = nlohmann::ordered_json;
const std::string kFixtures = std::string(TRL_TEST_DATA_DIR) + "/parquet/";

void copy(const std::string& fixture, const std::string& to) {
  stdfs::create_directories(stdfs::path(to).parent_path());
  stdfs::copy_file(kFixtures + fixture, to, stdfs::copy_options::overwrite_existing);
}

std::vector<ojson> expected(const std::string& name) { return ojson::parse(test::read_file(kFixtures + name + ".json")).get<std::vector<ojson>>(); }

// Sets an environment variable for the scope of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// A hub cache holding trl-lib/Capybara as huggingface_hub lays it out: refs/main holds a commit, and each file of
// snapshots/<commit>/ is a symlink to blobs/<hash> (names out of order with the files', as hashes are).
struct HubCache {
  test::TempDir dir;
  std::string snapshot;
  HubCache() {
    const stdfs::path repo = stdfs::path(dir.path()) / "datasets--trl-lib--Capybara";
    snapshot = (repo / "snapshots" / "0123abcd").string();
    stdfs::create_directories(repo / "refs");
    test::write_file((repo / "refs" / "main").string(), "0123abcd\n");
    link("capybara.parquet", "ff01", "data/train-00000-of-00002.parquet");
    link("types_snappy.parquet", "0a02", "data/train-00001-of-00002.parquet");
    link("prompt_only.parquet", "5c03", "data/test-00000-of-00001.parquet");
    test::write_file(snapshot + "/README.md", "# no YAML header here\n");
  }
  void link(const std::string& fixture, const std::string& blob, const std::string& name) {
    const stdfs::path blobs = stdfs::path(snapshot).parent_path().parent_path() / "blobs";
    copy(fixture, (blobs / blob).string());
    stdfs::create_directories((stdfs::path(snapshot) / name).parent_path());
    const int depth = static_cast<int>(std::count(name.begin(), name.end(), '/'));
    std::string up = "../../";
    for (int i = 0; i < depth; ++i) up += "../";
    stdfs::create_symlink(up + "blobs/" + blob, stdfs::path(snapshot) / name);
  }
};

// A ref that is empty (an interrupted download) or names a path out of the snapshots is refused with the ref's file,
// instead of reading snapshots/ itself (every revision at once) or another repository (issue 37, defect 4).
TEST(Datasets, AHubRefThatNamesNoSnapshotIsRefused) {
  HubCache hub;
  ScopedEnv env("HF_HUB_CACHE", hub.dir.path());
  const std::string ref = hub.dir.file("datasets--trl-lib--Capybara/refs/main");
  for (const std::string& bad : {std::string("\n"), std::string("../../datasets--other--set/snapshots/0123abcd\n"), std::string("..")}) {
    test::write_file(ref, bad);
    const std::string e = test::error_of([] { load_dataset("trl-lib/Capybara", "train"); });
    EXPECT_NE(e.find(ref + ": this Hub-cache ref should hold the commit hash of a folder in"), std::string::npos) << e;
  }
  const std::string e = test::error_of([] { load_dataset("trl-lib/Capybara", "train", "", "../../x"); });
  EXPECT_NE(e.find("revision '../../x': not a branch, tag or commit"), std::string::npos) << e;
}

// A snapshot whose link lost its blob (an interrupted download) and a DatasetDict.save_to_disk folder are named for
// what they are, not "no data files" (issue 37, defect 11).
TEST(Datasets, ADanglingBlobLinkAndASavedDatasetDictAreNamed) {
  HubCache hub;
  ScopedEnv env("HF_HUB_CACHE", hub.dir.path());
  stdfs::remove(hub.dir.file("datasets--trl-lib--Capybara/blobs/0a02"));
  const std::string e = test::error_of([] { load_dataset("trl-lib/Capybara", "train"); });
  EXPECT_NE(e.find("data/train-00001-of-00002.parquet is a link to ../../../blobs/0a02, which does not exist (an interrupted download?)"),
            std::string::npos)
      << e;
  test::TempDir saved;
  stdfs::create_directories(saved.file("train"));
  test::write_file(saved.file("dataset_dict.json"), "{\"splits\": [\"train\"]}");
  test::write_file(saved.file("train/data-00000-of-00001.arrow"), "not read");
  test::write_file(saved.file("train/dataset_info.json"), "{}");
  const std::string d = test::error_of([&] { load_dataset(saved.path(), "train"); });
  EXPECT_NE(d.find("holds Arrow files (DatasetDict.save_to_disk)"), std::string::npos) << d;
}

TEST(Datasets, HubIdResolvesInTheLocalCacheWithShardsInOrder) {
  HubCache hub;
  ScopedEnv env("HF_HUB_CACHE", hub.dir.path());
  const Dataset train = load_dataset("trl-lib/Capybara", "train");
  const auto capy = expected("capybara"), types = expected("types_snappy");
  ASSERT_EQ(train.size(), capy.size() + types.size());
  for (size_t i = 0; i < capy.size(); ++i) ASSERT_EQ(train.row(i).dump(), capy[i].dump()) << i;
  EXPECT_EQ(train.row(capy.size())["id"], 0);  // the second shard follows the first
  EXPECT_EQ(train.location(0), hub.snapshot + "/data/train-00000-of-00002.parquet, row group 0, row 0");
  EXPECT_EQ(train.source_file(), hub.snapshot + "/data/train-00000-of-00002.parquet");
  const Dataset test = load_dataset("trl-lib/Capybara", "test");
  EXPECT_EQ(test.size(), expected("prompt_only").size());
  EXPECT_TRUE(has_split("trl-lib/Capybara", "test"));
  EXPECT_FALSE(has_split("trl-lib/Capybara", "validation"));
  const std::string e = test::error_of([] { load_dataset("trl-lib/Capybara", "validation"); });
  EXPECT_NE(e.find("no \"validation\" split; the splits are: test, train"), std::string::npos) << e;
  const std::string missing = test::error_of([] { load_dataset("trl-lib/NoSuch", "train"); });
  EXPECT_NE(missing.find("datasets--trl-lib--NoSuch/snapshots/main"), std::string::npos) << missing;
  EXPECT_NE(missing.find("never downloads"), std::string::npos);
}

TEST(Datasets, ParquetRowsReadInAnyOrderEqualTheFixture) {
  Dataset d;
  d.add_parquet(parquet::File::open(kFixtures + "types_zstd.parquet"));
  const auto want = expected("types_zstd");
  ASSERT_EQ(d.size(), want.size());
  for (size_t i = want.size(); i-- > 0;) ASSERT_EQ(d.row(i).dump(), want[i].dump()) << i;  // backwards: every row group again
  EXPECT_NE(test::error_of([&] { d.row(want.size()); }), "");
  EXPECT_EQ(d.location(17), kFixtures + "types_zstd.parquet, row group 1, row 1");
}

TEST(Datasets, ReadmeConfigsChooseTheFiles) {
  test::TempDir dir;
  const std::string root = dir.path();
  copy("capybara.parquet", root + "/sft/part-0.parquet");
  copy("preference.parquet", root + "/prefs/train.parquet");
  copy("prompt_only.parquet", root + "/prefs/eval.parquet");
  test::write_file(root + "/README.md",
                   "---\nlicense: apache-2.0\nconfigs:\n- config_name: sft\n  default: true\n  data_files:\n  - split: train\n    path: sft/*.parquet\n"
                   "- config_name: prefs\n  data_files:\n  - split: train\n    path: prefs/train.parquet\n  - split: test\n    path: \"prefs/eval*\"\n---\n# card\n");
  EXPECT_EQ(load_dataset(root, "train").size(), expected("capybara").size());  // the default config
  EXPECT_EQ(load_dataset(root, "train", "prefs").size(), expected("preference").size());
  EXPECT_EQ(load_dataset(root, "test", "prefs").size(), expected("prompt_only").size());
  const std::string e = test::error_of([&] { load_dataset(root, "train", "nope"); });
  EXPECT_NE(e.find("no config \"nope\"; the configs are: sft, prefs"), std::string::npos) << e;

  test::TempDir dirs;  // a config with a data_dir: the split rules inside that folder
  copy("capybara.parquet", dirs.file("chat/train.parquet"));
  copy("prompt_only.parquet", dirs.file("chat/test.parquet"));
  copy("preference.parquet", dirs.file("other/train.parquet"));
  test::write_file(dirs.file("README.md"), "---\nconfigs:\n- config_name: chat\n  data_dir: chat\n---\n");
  EXPECT_EQ(load_dataset(dirs.path(), "train").size(), expected("capybara").size());
  EXPECT_EQ(load_dataset(dirs.path(), "test").size(), expected("prompt_only").size());

  // A header that does not parse, and a `configs:` value of the wrong kind, in the project's words with the line
  // (they were yaml-cpp's own text).
  test::write_file(dirs.file("README.md"), "---\nconfigs:\n- config_name: chat\n  data_dir: [chat\n---\n");
  std::string header_error = test::error_of([&] { load_dataset(dirs.path(), "train"); });
  EXPECT_NE(header_error.find("README.md: the YAML header between the --- lines does not parse (line "), std::string::npos) << header_error;
  test::write_file(dirs.file("README.md"), "---\nconfigs:\n- config_name: chat\n  data_dir: {a: 1}\n---\n");
  header_error = test::error_of([&] { load_dataset(dirs.path(), "train"); });
  EXPECT_NE(header_error.find("README.md: a `configs:` entry (line 4) holds a value of the wrong kind"), std::string::npos) << header_error;
  EXPECT_EQ(header_error.find("yaml-cpp"), std::string::npos) << header_error;
}

TEST(Datasets, ConfigFoldersSynonymsAndJsonLinesBesideParquet) {
  test::TempDir dir;
  const std::string root = dir.path();
  copy("capybara.parquet", root + "/default/train/0000.parquet");  // the Hub's Parquet conversion layout
  copy("preference.parquet", root + "/default/validation/0000.parquet");
  EXPECT_EQ(load_dataset(root, "train", "default").size(), expected("capybara").size());
  EXPECT_EQ(load_dataset(root, "validation", "default").size(), expected("preference").size());
  EXPECT_NE(test::error_of([&] { load_dataset(root, "train", "other"); }).find("folders there: default"), std::string::npos);

  test::TempDir flat;
  test::write_file(flat.file("train.jsonl"), "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  test::write_file(flat.file("dev.jsonl"), "{\"text\": \"c\"}\n");
  EXPECT_EQ(load_dataset(flat.path(), "validation").size(), 1u);  // dev.jsonl is the validation split
  EXPECT_EQ(load_dataset(flat.path(), "dev").size(), 1u);
  EXPECT_EQ(load_dataset(flat.path(), "train").location(1), flat.file("train.jsonl") + ":2");

  test::TempDir pushed;  // push_to_hub's shard names give any split name; keywords then no longer apply
  copy("preference.parquet", pushed.file("data/train_prefs-00000-of-00001.parquet"));
  copy("prompt_only.parquet", pushed.file("data/test_prefs-00000-of-00001.parquet"));
  copy("capybara.parquet", pushed.file("data/train.parquet"));
  EXPECT_EQ(load_dataset(pushed.path(), "train_prefs").size(), expected("preference").size());
  const std::string e = test::error_of([&] { load_dataset(pushed.path(), "train"); });
  EXPECT_NE(e.find("no \"train\" split; the splits are: test_prefs, train_prefs"), std::string::npos) << e;
  test::TempDir keywords;
  test::write_file(keywords.file("my_train-1.jsonl"), "{\"text\": \"a\"}\n");
  test::write_file(keywords.file("evaluation.jsonl"), "{\"text\": \"b\"}\n");
  test::write_file(keywords.file("trainer.jsonl"), "{\"text\": \"not a split name\"}\n");
  EXPECT_EQ(load_dataset(keywords.path(), "train").size(), 1u);
  EXPECT_EQ(load_dataset(keywords.path(), "test").size(), 1u);

  test::TempDir loose;  // files that name no split are all "train"
  copy("preference.parquet", loose.file("pairs.parquet"));
  test::write_file(loose.file("more.jsonl"), "{\"prompt\": \"p\", \"chosen\": \"c\", \"rejected\": \"r\"}\n");
  EXPECT_EQ(load_dataset(loose.path(), "train").size(), expected("preference").size() + 1);
}

TEST(Datasets, BrokenParquetInASplitNamesTheFile) {
  test::TempDir dir;
  std::string bytes = test::read_file(kFixtures + "capybara.parquet");
  bytes.resize(bytes.size() / 2);
  test::write_file(dir.file("train.parquet"), bytes);
  const std::string e = test::error_of([&] { load_dataset(dir.path(), "train"); });
  EXPECT_NE(e.find(dir.file("train.parquet") + ": not a Parquet file"), std::string::npos) << e;
  test::TempDir arrow;
  test::write_file(arrow.file("data-00000-of-00001.arrow"), "x");
  test::write_file(arrow.file("state.json"), "{}");
  EXPECT_NE(test::error_of([&] { load_dataset(arrow.path(), "train"); }).find("save_to_disk"), std::string::npos);
}

// Gzip-compressed JSON lines and JSON arrays (train.jsonl.gz, as several Hub datasets store them) are read as
// `datasets` reads them, compressed by the gzip program itself; damaged or mislabelled ones are named, and a folder
// of formats trl.cpp does not read names its files instead of calling itself empty.
TEST(Datasets, GzipJsonFilesAreReadAndOtherFormatsNamed) {
  test::TempDir dir;
  test::write_file(dir.file("train.jsonl"), "{\"text\": \"a\"}\n\n{\"text\": \"b\"}\n");
  test::write_file(dir.file("test.json"), "[{\"text\": \"c\"}, {\"text\": \"d\"}, {\"text\": \"e\"}]");
  std::string out;
  ASSERT_EQ(test::run_command("gzip " + dir.file("train.jsonl") + " " + dir.file("test.json") + " 2>&1", &out), 0) << out;
  const Dataset train = load_dataset(dir.path(), "train");
  ASSERT_EQ(train.size(), 2u);
  EXPECT_EQ(train.row(1)["text"], "b");
  EXPECT_EQ(train.location(1), dir.file("train.jsonl.gz") + ":3");  // the line in the decompressed text
  const Dataset test = load_dataset(dir.path(), "test");
  ASSERT_EQ(test.size(), 3u);
  EXPECT_EQ(test.row(2)["text"], "e");
  EXPECT_EQ(load_dataset(dir.file("train.jsonl.gz")).size(), 2u);  // a file given by name

  test::TempDir bad;
  std::string bytes = test::read_file(dir.file("test.json.gz"));
  test::write_file(bad.file("cut.jsonl.gz"), bytes.substr(0, bytes.size() / 2));
  std::string e = test::error_of([&] { load_dataset(bad.file("cut.jsonl.gz")); });
  EXPECT_NE(e.find("cut.jsonl.gz: the gzip data is damaged after"), std::string::npos) << e;
  test::write_file(bad.file("plain.jsonl.gz"), "{\"text\": \"a\"}\n");
  e = test::error_of([&] { load_dataset(bad.file("plain.jsonl.gz")); });
  EXPECT_NE(e.find("plain.jsonl.gz: not gzip-compressed, though its name ends in .gz"), std::string::npos) << e;
  bytes[bytes.size() - 12] ^= 0x55;  // a flipped byte in the compressed data or its checksum
  test::write_file(bad.file("flip.jsonl.gz"), bytes);
  e = test::error_of([&] { load_dataset(bad.file("flip.jsonl.gz")); });
  EXPECT_NE(e.find("flip.jsonl.gz: the gzip data is damaged"), std::string::npos) << e;

  test::TempDir other;
  test::write_file(other.file("README.md"), "# a dataset\n");
  test::write_file(other.file("data.csv"), "text\na\n");
  test::write_file(other.file("train.jsonl.zst"), "x");
  e = test::error_of([&] { load_dataset(other.path(), "train"); });
  EXPECT_NE(e.find("it holds data.csv, train.jsonl.zst, which trl.cpp does not read"), std::string::npos) << e;
}

TEST(Datasets, DatasetInfoPrintsSplitsColumnsAndFirstRows) {
  HubCache hub;
  std::string out;
  ASSERT_EQ(test::run_command("HF_HUB_CACHE=" + hub.dir.path() + " " + std::string(TRL_BINARY) + " dataset-info trl-lib/Capybara --rows 1 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("at " + hub.snapshot), std::string::npos) << out;
  EXPECT_NE(out.find("split test: 12 rows in 1 file"), std::string::npos) << out;
  EXPECT_NE(out.find("split train: 100 rows in 2 files"), std::string::npos) << out;
  EXPECT_NE(out.find("data/train-00000-of-00002.parquet: 40 rows, 3 row groups"), std::string::npos) << out;
  EXPECT_NE(out.find("  messages: list<struct<content: string, role: string>>"), std::string::npos) << out;
  EXPECT_NE(out.find("  {\"source\":\"Airoboros\",\"messages\":[{\"content\":\"group a\""), std::string::npos) << out;
  ASSERT_NE(test::run_command("HF_HUB_CACHE=" + hub.dir.path() + " " + std::string(TRL_BINARY) + " dataset-info trl-lib/Capybara --split dev 2>&1", &out), 0);
  EXPECT_NE(out.find("no \"dev\" split; the splits are: test, train"), std::string::npos) << out;
}

// The same conversations as Parquet (from the hub cache) and as JSON lines train to the same losses.
TEST(Datasets, TrainingOnParquetEqualsTrainingOnTheSameRowsAsJsonLines) {
  HubCache hub;
  ScopedEnv env("HF_HUB_CACHE", hub.dir.path());
  stdfs::remove(hub.snapshot + "/data/train-00001-of-00002.parquet");  // capybara rows only
  test::TinyModel t;
  std::string jsonl;
  for (const ojson& row : expected("capybara")) jsonl += row.dump() + "\n";
  test::write_file(t.dir.file("capybara.jsonl"), jsonl);
  auto run = [&](const Dataset& data, const std::string& out) {
    SFTConfig c;
    c.output_dir = t.dir.file(out);
    c.bf16 = false;
    c.max_length = 64;
    c.per_device_train_batch_size = 2;
    c.max_steps = 3;
    c.logging_steps = 1;
    c.report = false;
    c.progress = false;
    SFTTrainer tr(t.model, test::qwen3_tokenizer(), data, c);
    std::vector<double> losses;
    for (const auto& l : tr.train().log_history)
      if (l.contains("loss")) losses.push_back(l["loss"].get<double>());
    return losses;
  };
  const auto a = run(load_dataset("trl-lib/Capybara"), "pq"), b = run(load_dataset(t.dir.file("capybara.jsonl")), "js");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(std::isfinite(a[i]));
    EXPECT_EQ(a[i], b[i]) << i;
  }
}

}  // namespace
}  // namespace trl

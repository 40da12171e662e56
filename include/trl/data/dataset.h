// Datasets (docs/DATASETS.md): rows as JSON objects, from JSON lines / JSON files (held in memory) or Parquet files
// (read a row group at a time, when a row is asked for), found by a path or by a Hugging Face dataset id in the
// local hub cache. Every row remembers where it came from, so that every later error can name it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trl {

namespace parquet {
class File;
}

struct Dataset {
  // Rows held in memory (JSON lines and JSON files, rows built in code): row i < rows.size() is rows[i], and
  // where[i] says where it came from ("file:line", "file[index]").
  std::vector<nlohmann::ordered_json> rows;
  std::vector<std::string> where;

  // Every row: the in-memory ones, then those of the Parquet files in order.
  size_t size() const;
  bool empty() const { return size() == 0; }
  // Row i (a copy: a Parquet row is decoded with its row group, and one row group stays decoded, so reading rows in
  // order decodes each row group once). Throws trl::Error past the end.
  nlohmann::ordered_json row(size_t i) const;
  // "file:line", "file[index]" or "file, row group G, row R".
  std::string location(size_t i) const;
  // The file the first row came from ("" when rows were built in code).
  std::string source_file() const;

  // Appends the rows of a Parquet file (nothing is read until a row is asked for).
  void add_parquet(const parquet::File& file);

  struct ParquetPart;  // a file, its row-group index and the decoded row group

 private:
  std::vector<std::shared_ptr<ParquetPart>> parquet_;
  std::vector<size_t> parquet_start_;  // first row (after the in-memory rows) of each file
  size_t parquet_rows_ = 0;
};

// Loads one split of a dataset. `name` is:
//  - a file: .parquet, .jsonl, or .json (a JSON array of objects, or JSON lines): the "train" split;
//  - a folder: the split's files, found the way `datasets` finds them in a repository (docs/DATASETS.md): the
//    `configs:` of README.md's YAML header, else `<config>/<split>...` when a config is given, else files named for
//    the split (data/train-00000-of-00001.parquet, train.jsonl, test/0000.parquet, ...); several shards in order;
//  - a Hub id ("trl-lib/Capybara"), looked up in the local Hugging Face cache only (datasets--org--name, refs/<revision>).
// A malformed line, a broken Parquet file or a missing split is an error naming the file and what it looked for.
Dataset load_dataset(const std::string& name, const std::string& split = "train", const std::string& config = "", const std::string& revision = "main");

// datasets.load_dataset(name, data_dir=..., data_files=...): the split's files among those of the dataset `name` (a
// folder, or a Hub id in the local cache) under `data_dir` ("" = the whole dataset), chosen by `data_files`: glob
// patterns relative to that folder, per split (a list of patterns given without split names is the "train" split,
// as `datasets` makes it); with no patterns, the split rules of load_dataset apply inside data_dir.
using DataFiles = std::vector<std::pair<std::string, std::vector<std::string>>>;
Dataset load_dataset_files(const std::string& name, const std::string& split, const std::string& data_dir, const DataFiles& data_files,
                           const std::string& revision = "main");

// Whether the dataset has the split (a single file has only "train").
bool has_split(const std::string& name, const std::string& split, const std::string& config = "", const std::string& revision = "main");

// What `trl dataset-info` shows: the folder a name resolves to, and each split's files.
struct DatasetSplit {
  std::string name;
  std::vector<std::string> files;
};
struct DatasetLayout {
  std::string root;  // the folder (or file) the name resolved to
  std::vector<DatasetSplit> splits;
};
DatasetLayout resolve_dataset(const std::string& name, const std::string& config = "", const std::string& revision = "main");
// The layout of load_dataset_files.
DatasetLayout resolve_dataset_files(const std::string& name, const std::string& data_dir, const DataFiles& data_files, const std::string& revision = "main");

}  // namespace trl

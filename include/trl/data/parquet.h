// Reading Apache Parquet files (what Hugging Face datasets are on the Hub): rows come out as the same JSON objects
// the JSON lines reader makes, one row group at a time, so a large file streams. docs/PARQUET.md says what is
// supported: data pages v1 and v2; PLAIN, dictionary, RLE / bit-packed, DELTA_* and BYTE_STREAM_SPLIT encodings;
// SNAPPY, ZSTD, GZIP or no compression; nested lists, structs and maps with nulls at every level.
//
// Every malformed input is a trl::Error naming the file, and the row group and column where it was found; sizes read
// from the file are checked against the file and against ReadLimits before anything is allocated for them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trl::parquet {

struct ReadLimits {
  int64_t max_page_bytes = int64_t{1} << 30;            // a page's compressed or uncompressed size
  int64_t max_values_per_row_group = int64_t{1} << 28;  // level entries of all columns of one row group together
  int64_t max_bytes_per_row_group = int64_t{1} << 33;   // the decoded rows: string bytes plus ~16-64 per value
  int64_t max_footer_bytes = int64_t{1} << 28;           // the footer (FileMetaData)
};

struct ColumnInfo {
  std::string name;  // a top-level column
  std::string type;  // "string", "int64", "list<struct<content: string, role: string>>", ...
};

class File {
 public:
  // Reads and checks the footer (nothing else is read until a row group is asked for).
  static File open(const std::string& path, ReadLimits limits = {});
  // A file held in memory (tests, the fuzz target); `name` stands for the path in messages.
  static File from_bytes(std::string bytes, const std::string& name, ReadLimits limits = {});

  const std::string& path() const;
  int64_t num_rows() const;
  int num_row_groups() const;
  int64_t row_group_rows(int group) const;
  int64_t row_group_bytes(int group) const;  // uncompressed size of the row group's column data, as the footer says
  std::vector<ColumnInfo> columns() const;
  const std::string& created_by() const;

  // The rows of one row group, as JSON objects with the top-level columns in schema order.
  std::vector<nlohmann::ordered_json> read_row_group(int group) const;

  struct Impl;

 private:
  File() = default;  // from open() or from_bytes() only
  std::shared_ptr<const Impl> impl_;
};

}  // namespace trl::parquet

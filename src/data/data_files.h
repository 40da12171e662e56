// The files of one split of a resolved dataset (data_files.cpp); with `required`, a missing split is an error that
// lists the splits there are.
#pragma once

#include <string>
#include <vector>

#include "trl/data/dataset.h"

namespace trl {

std::vector<std::string> split_files(const DatasetLayout& layout, const std::string& split, bool required);

// How a data file is read, from its name: "parquet", "jsonl" or "json" (also gzip-compressed: .jsonl.gz, .json.gz,
// as `datasets` reads them), or "" for a file that is not data. Metadata files (dataset_info.json, ...) are "".
std::string data_file_kind(const std::string& path);
bool is_gzip_file_name(const std::string& path);

// A split's canonical name, as `datasets` groups them: "dev" -> "validation", "training" -> "train", ...
std::string canonical_split_name(const std::string& split);

}  // namespace trl

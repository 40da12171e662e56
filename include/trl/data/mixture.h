// TRL's dataset mixtures (DatasetMixtureConfig; a YAML config's `datasets:` list, docs/DATASETS.md): several datasets,
// each with its own config, folder, files, split and columns, concatenated in order, optionally in given shares and
// split into train and test, as TRL's get_dataset does.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/data/dataset.h"

namespace trl {

// One entry of `datasets:` (TRL's DatasetConfig: the arguments of datasets.load_dataset).
struct DatasetMixtureEntry {
  std::string path;                        // a Hub id in the local cache, a folder or a file
  std::string name;                        // the dataset configuration (README `configs:` or <name>/ folder)
  std::string data_dir;                    // a folder inside the dataset
  DataFiles data_files;                    // glob patterns per split; a plain list is "train"
  std::string split = "train";
  std::optional<std::vector<std::string>> columns;  // the columns kept (all when unset)
  std::optional<double> fraction;                   // the share of the mixture; set for every entry or none
};

struct DatasetMixture {
  std::vector<DatasetMixtureEntry> datasets;
  bool streaming = false;                 // accepted; a mixture's rows are held in memory
  std::optional<double> test_split_size;  // a fraction in (0, 1) or a whole number of rows for the "test" split
};

// Reads `datasets:` as JSON (the YAML list given to the option), naming the entry and field that are wrong.
DatasetMixture parse_dataset_mixture(const nlohmann::json& datasets, const std::string& where);

// TRL's get_dataset: each entry loaded and its columns chosen; with fractions, normalised to sum to 1 and the mixture
// made as large as it can be without repeating a row (the first round(share * total) rows of each); the entries
// concatenated in order; with test_split_size, the rows shuffled by `seed` and split into "train" and "test" (the
// size rounded up, as datasets' train_test_split does). Returns the splits by name.
std::map<std::string, Dataset> load_dataset_mixture(const DatasetMixture& mixture, uint64_t seed, const std::string& revision = "main");

}  // namespace trl

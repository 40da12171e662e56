// Datasets from local JSON lines / JSON files (docs/TRAINING.md): rows as JSON objects, each remembering the
// file and line it came from so that every later error can name it.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trl {

struct Dataset {
  std::vector<nlohmann::ordered_json> rows;
  std::vector<std::string> where;  // "file:line" (JSON lines) or "file[index]" (a JSON array) per row
  size_t size() const { return rows.size(); }
};

// `path` is a .jsonl / .json file (the "train" split), or a folder holding `<split>.jsonl`, `<split>.json`, or
// `data/<split>*.jsonl` (the layout of a Hugging Face dataset repository). A malformed line is an error naming file
// and line; a missing split lists the places looked at.
Dataset load_dataset(const std::string& path, const std::string& split = "train");

// Whether `path` has the split (a file has only "train").
bool has_split(const std::string& path, const std::string& split);

}  // namespace trl

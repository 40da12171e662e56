#include "trl/data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "trl/core/error.h"
#include "core/fs.h"

namespace trl {

namespace {

namespace stdfs = std::filesystem;
using ojson = nlohmann::ordered_json;

void read_jsonl(const std::string& file, Dataset& out) {
  std::ifstream in(file);
  if (!in) fail("{}: cannot open", file);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ojson j;
    try {
      j = ojson::parse(line);
    } catch (const ojson::parse_error& e) {
      fail("{}:{}: not valid JSON: {}", file, n, e.what());
    }
    if (!j.is_object()) fail("{}:{}: expected a JSON object per line, got {}", file, n, j.type_name());
    out.rows.push_back(std::move(j));
    out.where.push_back(fmt::format("{}:{}", file, n));
  }
}

void read_json(const std::string& file, Dataset& out) {
  ojson j;
  try {
    j = ojson::parse(read_text_file(file));
  } catch (const ojson::parse_error& e) {
    fail("{}: not valid JSON: {}", file, e.what());
  }
  if (!j.is_array()) fail("{}: expected a JSON array of objects", file);
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_object()) fail("{}[{}]: expected a JSON object, got {}", file, i, j[i].type_name());
    out.rows.push_back(j[i]);
    out.where.push_back(fmt::format("{}[{}]", file, i));
  }
}

// A .json file is a JSON array of objects, or JSON lines (what `datasets.Dataset.to_json` writes by default): the
// first character that is not blank tells which.
bool starts_with_array(const std::string& file) {
  std::ifstream in(file);
  if (!in) fail("{}: cannot open", file);
  char ch = 0;
  while (in.get(ch)) {
    if (ch == '[') return true;
    if (ch != ' ' && ch != '\t' && ch != '\r' && ch != '\n' && ch != '\xEF' && ch != '\xBB' && ch != '\xBF') return false;  // BOM bytes skipped
  }
  return false;
}

void read_file(const std::string& file, Dataset& out) {
  const std::string ext = stdfs::path(file).extension().string();
  if (ext == ".json" && starts_with_array(file)) read_json(file, out);
  else read_jsonl(file, out);
}

// The files of `split` in a folder, or none.
std::vector<std::string> split_files(const std::string& dir, const std::string& split, std::vector<std::string>* looked) {
  for (const char* ext : {".jsonl", ".json"}) {
    const std::string f = (stdfs::path(dir) / (split + ext)).string();
    if (looked) looked->push_back(f);
    if (stdfs::is_regular_file(f)) return {f};
  }
  std::vector<std::string> out;
  const stdfs::path data = stdfs::path(dir) / "data";
  if (looked) looked->push_back((data / (split + "*.jsonl")).string());
  if (stdfs::is_directory(data))
    for (const auto& e : stdfs::directory_iterator(data)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() && name.rfind(split, 0) == 0 && (e.path().extension() == ".jsonl" || e.path().extension() == ".json"))
        out.push_back(e.path().string());
    }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

bool has_split(const std::string& path, const std::string& split) {
  if (stdfs::is_regular_file(path)) return split == "train";
  return stdfs::is_directory(path) && !split_files(path, split, nullptr).empty();
}

Dataset load_dataset(const std::string& path, const std::string& split) {
  Dataset out;
  if (stdfs::is_regular_file(path)) {
    if (split != "train") fail("dataset {}: a single file is the \"train\" split; there is no \"{}\" split", path, split);
    read_file(path, out);
  } else if (stdfs::is_directory(path)) {
    std::vector<std::string> looked;
    const auto files = split_files(path, split, &looked);
    if (files.empty()) {
      std::string where;
      for (const auto& l : looked) where += "\n  " + l;
      fail("dataset {}: no \"{}\" split; looked for:{}", path, split, where);
    }
    for (const auto& f : files) read_file(f, out);
  } else {
    fail("dataset {}: no such file or folder (datasets are local JSON lines or JSON files; nothing is downloaded)", path);
  }
  if (out.rows.empty()) fail("dataset {}: the \"{}\" split has no rows", path, split);
  return out;
}

}  // namespace trl

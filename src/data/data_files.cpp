// Which files hold a dataset's split (docs/DATASETS.md), decided the way Hugging Face `datasets` decides it for a
// repository without a loading script:
//  1. README.md's YAML header lists `configs:` with `data_files` per split (glob patterns): used when present;
//  2. else, with a config name, only the files under `<config>/` count (the Hub's Parquet conversion layout);
//  3. files named data/<split>-00000-of-00001.* (what push_to_hub writes) give their splits, any names;
//  4. else a split keyword in a file name, between separators ("-._ 0-9"), or as a folder: train.jsonl,
//     my_train-1.json and train/0000.parquet are "train"; "validation" also takes valid/dev/val, "test" takes
//     testing/eval/evaluation, "train" takes training;
//  5. else every file is "train".
#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "core/fs.h"
#include "trl/core/error.h"
#include "trl/data/dataset.h"
#include "trl/io/hub.h"
#include "data/data_files.h"

namespace trl {

namespace {

namespace stdfs = std::filesystem;

bool is_data_file(const stdfs::path& p) { return !data_file_kind(p.string()).empty(); }

// Files that are neither data nor the metadata a dataset folder holds: named when a folder has no data file, so that
// a dataset of .csv or .jsonl.zst files is not reported as empty.
bool is_skipped_data(const stdfs::path& p) {
  const std::string name = p.filename().string(), ext = p.extension().string();
  if (name.empty() || name[0] == '.' || is_data_file(p)) return false;
  for (const char* meta : {".md", ".py", ".txt", ".lock", ".yaml", ".yml", ".json", ".cff"})
    if (ext == meta) return false;
  return name.rfind("LICENSE", 0) != 0;
}

// Data files under `root`, relative, sorted; hidden folders (.git, .cache) skipped. Paths stay the names in the
// folder: in the hub cache every snapshot file is a symlink into blobs/, so nothing here resolves links. Files of
// other formats go to `skipped`.
std::vector<std::string> data_files(const stdfs::path& root, std::vector<std::string>& skipped) {
  std::vector<std::string> out;
  std::error_code ec;
  auto it = stdfs::recursive_directory_iterator(root, ec);
  for (; !ec && it != stdfs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code st;
    if (it->is_directory(st) && !name.empty() && name[0] == '.') {
      it.disable_recursion_pending();
      continue;
    }
    // A Hub-cache snapshot links each file to its blob: a link whose blob is missing is an interrupted download, and
    // skipping it would drop its rows without a word.
    if (it->is_symlink(st) && !stdfs::exists(it->path(), st) && is_data_file(it->path())) {
      std::error_code rl;
      fail("dataset {}: {} is a link to {}, which does not exist (an interrupted download?): download the dataset again", root.string(),
           it->path().lexically_relative(root).generic_string(), stdfs::read_symlink(it->path(), rl).string());
    }
    if (it->is_regular_file(st) && is_data_file(it->path())) out.push_back(it->path().lexically_relative(root).generic_string());
    else if (it->is_regular_file(st) && is_skipped_data(it->path())) skipped.push_back(it->path().lexically_relative(root).generic_string());
  }
  if (ec) fail("dataset {}: cannot list the folder: {}", root.string(), ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

// Arrow files in the folder or in its split folders (what Dataset.save_to_disk and DatasetDict.save_to_disk write).
bool has_arrow_files(const stdfs::path& root) {
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(root, ec)) {
    if (e.path().extension() == ".arrow") return true;
    std::error_code sub;
    if (e.is_directory(sub))
      for (const auto& f : stdfs::directory_iterator(e.path(), sub))
        if (f.path().extension() == ".arrow") return true;
  }
  return false;
}

// Glob matching as `datasets` patterns use it: '*' within a path component, '**' across components, '?', [...].
bool glob_match(std::string_view pat, std::string_view s) {
  if (pat.empty()) return s.empty();
  if (pat.substr(0, 2) == "**") {
    std::string_view rest = pat.substr(2);
    if (!rest.empty() && rest[0] == '/') {  // "**/x" also matches "x"
      if (glob_match(rest.substr(1), s)) return true;
    }
    for (size_t i = 0; i <= s.size(); ++i)
      if (glob_match(rest, s.substr(i))) return true;
    return false;
  }
  if (pat[0] == '*') {
    for (size_t i = 0; i <= s.size(); ++i) {
      if (glob_match(pat.substr(1), s.substr(i))) return true;
      if (i < s.size() && s[i] == '/') break;
    }
    return false;
  }
  if (s.empty()) return false;
  if (pat[0] == '?') return s[0] != '/' && glob_match(pat.substr(1), s.substr(1));
  if (pat[0] == '[') {
    const size_t close = pat.find(']', 1);
    if (close != std::string_view::npos) {
      std::string_view set = pat.substr(1, close - 1);
      const bool negate = !set.empty() && (set[0] == '!' || set[0] == '^');
      if (negate) set.remove_prefix(1);
      bool in = false;
      for (size_t i = 0; i < set.size(); ++i) {
        if (i + 2 < set.size() && set[i + 1] == '-') {
          in = in || (s[0] >= set[i] && s[0] <= set[i + 2]);
          i += 2;
        } else {
          in = in || s[0] == set[i];
        }
      }
      return in != negate && glob_match(pat.substr(close + 1), s.substr(1));
    }
  }
  return pat[0] == s[0] && glob_match(pat.substr(1), s.substr(1));
}

// Split `split`: the files (relative to `root`, in their order) that match any of the glob patterns.
DatasetSplit matching_files(const stdfs::path& root, const std::vector<std::string>& files, const std::string& split,
                            const std::vector<std::string>& patterns) {
  DatasetSplit s{split, {}};
  for (const auto& f : files)
    if (std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) { return glob_match(p, f); })) s.files.push_back((root / f).string());
  return s;
}

// datasets' first rule: data/<split>-NNNNN-of-NNNNN* (what push_to_hub writes, any split name): the name, or "".
std::string sharded_split_name(const std::string& rel) {
  if (rel.rfind("data/", 0) != 0 || rel.find('/', 5) != std::string::npos) return "";
  const std::string_view name = std::string_view(rel).substr(5);
  auto digits = [&](size_t at) {
    for (size_t i = at; i < at + 5; ++i)
      if (i >= name.size() || name[i] < '0' || name[i] > '9') return false;
    return true;
  };
  for (size_t dash = name.find('-'); dash != std::string_view::npos && dash > 0; dash = name.find('-', dash + 1))
    if (digits(dash + 1) && name.substr(dash + 6, 4) == "-of-" && digits(dash + 10)) return std::string(name.substr(0, dash));
  return "";
}

// datasets' keyword patterns: `keyword` in the file name, after the start or a separator ("-._ 0-9", or a folder) and
// before a separator; or a folder named `keyword` (or ending in a separator and `keyword`).
bool names_keyword(const std::string& rel, const std::string& keyword) {
  constexpr std::string_view kSep = "-._ 0123456789";
  for (size_t at = rel.find(keyword); at != std::string::npos; at = rel.find(keyword, at + 1)) {
    if (at > 0 && rel[at - 1] != '/' && kSep.find(rel[at - 1]) == std::string_view::npos) continue;
    const size_t after = at + keyword.size();
    if (after >= rel.size()) continue;
    if (rel[after] == '/') return true;                                                                  // a folder
    if (kSep.find(rel[after]) != std::string_view::npos && rel.find('/', after) == std::string::npos) return true;  // the file name
  }
  return false;
}

const std::vector<std::vector<std::string>>& split_synonyms() {
  static const std::vector<std::vector<std::string>> groups = {
      {"train", "training"}, {"validation", "valid", "dev", "val"}, {"test", "testing", "eval", "evaluation"}};
  return groups;
}

// The canonical name of a split ("dev" -> "validation"), or the name itself.
std::string canonical_split(const std::string& s) {
  for (const auto& g : split_synonyms())
    if (std::find(g.begin(), g.end(), s) != g.end()) return g[0];
  return s;
}

// README.md's YAML header, or a null node.
YAML::Node readme_header(const stdfs::path& root) {
  const stdfs::path readme = root / "README.md";
  std::error_code ec;
  if (!stdfs::is_regular_file(readme, ec)) return {};
  const std::string text = read_text_file(readme.string());
  if (text.rfind("---", 0) != 0) return {};
  const size_t end = text.find("\n---", 3);
  if (end == std::string::npos) return {};
  try {
    return YAML::Load(text.substr(3, end - 3));
  } catch (const YAML::Exception& e) {
    fail("{}: the YAML header between the --- lines does not parse (line {}, column {}): {}", readme.string(), e.mark.line + 1,
         e.mark.column + 1, e.msg);
  }
}

std::vector<std::string> as_patterns(const YAML::Node& n) {
  std::vector<std::string> out;
  if (n.IsScalar()) out.push_back(n.as<std::string>());
  else if (n.IsSequence())
    for (size_t i = 0; i < n.size(); ++i) out.push_back(n[i].as<std::string>());
  return out;
}

void splits_from_names(const stdfs::path& root, const std::string& config, std::vector<std::string> files, DatasetLayout& out);

// Splits from the `configs:` of README.md; false when there are none.
bool splits_from_readme(const stdfs::path& root, const std::string& config, const std::vector<std::string>& files, DatasetLayout& out) {
  const YAML::Node header = readme_header(root);
  if (!header || !header.IsMap() || !header["configs"] || !header["configs"].IsSequence()) return false;
  const std::string readme = (root / "README.md").string();
  try {
    YAML::Node chosen;
    bool found = false;
    std::vector<std::string> names;
    const YAML::Node configs = header["configs"];
    for (size_t i = 0; i < configs.size(); ++i) {
      const YAML::Node c = configs[i];
      const std::string name = c["config_name"] ? c["config_name"].as<std::string>() : "default";
      names.push_back(name);
      const bool is_default = c["default"] && c["default"].as<bool>();
      if (config.empty() ? (is_default || (!found && (name == "default" || configs.size() == 1))) : name == config) chosen = c, found = true;
      if (config.empty() && is_default) break;
    }
    if (!found) {
      if (config.empty()) fail("{}: several configs ({}) and none is the default: pass --dataset_config", readme, fmt::join(names, ", "));
      fail("{}: no config \"{}\"; the configs are: {}", readme, config, fmt::join(names, ", "));
    }
    const YAML::Node df = chosen["data_files"];
    std::vector<std::pair<std::string, std::vector<std::string>>> splits;
    if (!df) {
      if (!chosen["data_dir"]) return false;
      // A config with only a data_dir: the split rules below, inside that folder.
      const std::string dir = chosen["data_dir"].as<std::string>();
      std::vector<std::string> under;
      for (const auto& f : files)
        if (f.rfind(dir + "/", 0) == 0) under.push_back(f.substr(dir.size() + 1));
      if (under.empty()) fail("{}: config \"{}\" has data_dir {} and no data files there", readme, found ? chosen["config_name"].as<std::string>("default") : "", dir);
      splits_from_names(root / dir, "", under, out);
      return true;
    }
    if (df.IsScalar() || (df.IsSequence() && df.size() > 0 && df[0].IsScalar())) {
      splits.push_back({"train", as_patterns(df)});
    } else if (df.IsSequence()) {
      for (size_t i = 0; i < df.size(); ++i) {
        const YAML::Node s = df[i];
        splits.push_back({s["split"] ? s["split"].as<std::string>() : "train", as_patterns(s["path"])});
      }
    } else if (df.IsMap()) {
      for (const auto& kv : df) splits.push_back({kv.first.as<std::string>(), as_patterns(kv.second)});
    }
    for (const auto& [split, patterns] : splits) {
      out.splits.push_back(matching_files(root, files, split, patterns));
    }
  } catch (const YAML::Exception& e) {  // a value of the wrong kind (a list where text belongs, ...)
    const std::string at = e.mark.is_null() ? std::string() : fmt::format(" (line {})", e.mark.line + 1);
    fail("{}: a `configs:` entry{} holds a value of the wrong kind: config_name, data_dir, split and path are text, default is "
         "true or false, data_files is a path, a list of paths or a list of {{split, path}}",
         readme, at);
  }
  return true;
}

void splits_from_names(const stdfs::path& root, const std::string& config, std::vector<std::string> files, DatasetLayout& out) {
  if (!config.empty()) {
    std::vector<std::string> under;
    std::set<std::string> folders;
    for (const auto& f : files) {
      if (f.rfind(config + "/", 0) == 0) under.push_back(f.substr(config.size() + 1));
      if (const size_t slash = f.find('/'); slash != std::string::npos) folders.insert(f.substr(0, slash));
    }
    if (under.empty())
      fail("dataset {}: no config \"{}\" (no folder {}/ and no `configs:` in README.md); folders there: {}", root.string(), config, config,
           folders.empty() ? "none" : fmt::format("{}", fmt::join(folders, ", ")));
    files = std::move(under);
  }
  const stdfs::path base = config.empty() ? root : root / config;
  std::vector<DatasetSplit> splits;
  auto add = [&](const std::string& split, const std::string& f) {
    auto it = std::find_if(splits.begin(), splits.end(), [&](const DatasetSplit& x) { return x.name == split; });
    if (it == splits.end()) splits.push_back({split, {}}), it = splits.end() - 1;
    it->files.push_back((base / f).string());
  };
  for (const auto& f : files)  // 1. data/<split>-00000-of-00001.parquet, any split name
    if (const std::string name = sharded_split_name(f); !name.empty()) add(name, f);
  if (splits.empty())  // 2. the split keywords and their synonyms
    for (const auto& group : split_synonyms())
      for (const auto& f : files)
        if (std::any_of(group.begin(), group.end(), [&](const std::string& k) { return names_keyword(f, k); })) add(group[0], f);
  if (splits.empty())  // 3. no file names a split: all of them are "train"
    for (const auto& f : files) add("train", f);
  out.splits = std::move(splits);
}

std::string resolve_hub_dataset(const std::string& name, const std::string& revision) {
  std::vector<std::string> looked{fmt::format("{} (no such local file or folder)", name)};
  const bool repo_like = !name.empty() && name[0] != '.' && name[0] != '/' && name[0] != '~' && std::count(name.begin(), name.end(), '/') <= 1 &&
                         name.find("..") == std::string::npos;
  if (repo_like) {
    std::string folder = "datasets--" + name;
    for (size_t p = folder.find('/'); p != std::string::npos; p = folder.find('/')) folder.replace(p, 1, "--");
    std::error_code ec;
    for (const std::string& cache : hub_cache_dirs()) {
      const stdfs::path repo = stdfs::path(cache) / folder;
      if (!stdfs::is_directory(repo, ec)) {
        looked.push_back((repo / "snapshots" / revision).string());
        continue;
      }
      const stdfs::path snap = hub_snapshot(repo.string(), revision);
      if (stdfs::is_directory(snap, ec)) return snap.string();
      looked.push_back(snap.string());
    }
  }
  throw NotFoundError(fmt::format("dataset '{}' not found. Looked in:\n  {}\ntrl.cpp never downloads: pass a local file or folder, or fetch the dataset into the Hugging Face "
       "cache first (for example `huggingface-cli download --repo-type dataset {}`), or set HF_HUB_CACHE / HF_HOME.",
       name, fmt::join(looked, "\n  "), name));
}

}  // namespace

bool is_gzip_file_name(const std::string& path) { return stdfs::path(path).extension() == ".gz"; }

std::string data_file_kind(const std::string& path) {
  const stdfs::path p(path);
  const std::string name = p.filename().string();
  if (name.empty() || name[0] == '.') return "";
  if (name == "dataset_info.json" || name == "dataset_dict.json" || name == "state.json" || name == "config.json") return "";
  const bool gz = is_gzip_file_name(path);
  const std::string ext = (gz ? p.stem() : p).extension().string();
  if (ext == ".parquet" && !gz) return "parquet";  // Parquet compresses its own pages
  if (ext == ".jsonl" || ext == ".json") return ext.substr(1);
  return "";
}

DatasetLayout resolve_dataset(const std::string& name, const std::string& config, const std::string& revision) {
  std::error_code ec;
  DatasetLayout out;
  if (stdfs::is_regular_file(name, ec)) {
    if (!is_data_file(name) && stdfs::path(name).extension() != ".json")
      fail("dataset {}: not a .parquet, .jsonl or .json file (or .jsonl.gz, .json.gz)", name);
    out.root = name;
    out.splits.push_back({"train", {name}});
    return out;
  }
  out.root = stdfs::is_directory(name, ec) ? name : resolve_hub_dataset(name, revision);
  const stdfs::path root(out.root);
  std::vector<std::string> skipped;
  const std::vector<std::string> files = data_files(root, skipped);
  if (!splits_from_readme(root, config, files, out)) splits_from_names(root, config, files, out);
  if (out.splits.empty()) {
    if (has_arrow_files(root))
      fail("dataset {}: holds Arrow files ({}.save_to_disk); trl.cpp reads Parquet, JSON lines and JSON: write each split with "
           "to_parquet() or to_json()",
           out.root, stdfs::exists(root / "dataset_dict.json", ec) ? "DatasetDict" : "Dataset");
    if (!skipped.empty())
      fail("dataset {}: no .parquet, .jsonl or .json files (or .jsonl.gz, .json.gz); it holds {}{}, which trl.cpp does not read: convert them "
           "to JSON lines or Parquet (datasets' to_json() or to_parquet())",
           out.root, fmt::join(skipped.begin(), skipped.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(skipped.size(), 5)), ", "),
           skipped.size() > 5 ? fmt::format(" and {} more", skipped.size() - 5) : "");
    fail("dataset {}: no .parquet, .jsonl or .json files (or .jsonl.gz, .json.gz)", out.root);
  }
  return out;
}

DatasetLayout resolve_dataset_files(const std::string& name, const std::string& data_dir, const DataFiles& by_split, const std::string& revision) {
  std::error_code ec;
  if (stdfs::is_regular_file(name, ec)) fail("dataset {}: data_dir and data_files choose files inside a folder or a Hub dataset, not a file", name);
  DatasetLayout out;
  const stdfs::path top = stdfs::is_directory(name, ec) ? stdfs::path(name) : stdfs::path(resolve_hub_dataset(name, revision));
  const stdfs::path root = data_dir.empty() ? top : top / data_dir;
  if (!stdfs::is_directory(root, ec)) fail("dataset {}: data_dir {}: no such folder in {}", name, data_dir, top.string());
  out.root = root.string();
  std::vector<std::string> skipped;
  const std::vector<std::string> files = data_files(root, skipped);
  if (by_split.empty()) {
    splits_from_names(root, "", files, out);
  } else {
    for (const auto& [split, patterns] : by_split) {
      DatasetSplit s = matching_files(root, files, split, patterns);
      if (s.files.empty())
        fail("dataset {}: data_files {} match no .parquet, .jsonl or .json file in {}", name, fmt::join(patterns, ", "), root.string());
      out.splits.push_back(std::move(s));
    }
  }
  if (out.splits.empty()) fail("dataset {}: no .parquet, .jsonl or .json files (or .jsonl.gz, .json.gz) in {}", name, root.string());
  return out;
}

std::string canonical_split_name(const std::string& split) { return canonical_split(split); }

std::vector<std::string> split_files(const DatasetLayout& layout, const std::string& split, bool required) {
  const std::string want = canonical_split(split);
  for (const auto& s : layout.splits)
    if (s.name == split || s.name == want) {
      if (s.files.empty() && required) fail("dataset {}: the \"{}\" split's patterns match no files", layout.root, split);
      return s.files;
    }
  if (!required) return {};
  std::vector<std::string> names;
  for (const auto& s : layout.splits) names.push_back(s.name);
  fail("dataset {}: no \"{}\" split; the splits are: {} (pass --dataset_train_split / --dataset_test_split)", layout.root, split, fmt::join(names, ", "));
}

}  // namespace trl

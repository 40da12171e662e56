// `trl dataset-info NAME`: what `load_dataset` users look at first: where the name resolved to, each split's files
// and row counts, the columns and their types (the Parquet schema, or the first row's JSON), and the first rows.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "cli/options.h"
#include "data/data_files.h"
#include "trl/core/error.h"
#include "trl/data/dataset.h"
#include "trl/data/parquet.h"

namespace trl::cli {

namespace {

using ojson = nlohmann::ordered_json;

// A `datasets`-style type of a JSON value ("string", "list<struct<content: string, role: string>>").
std::string json_type(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::string: return "string";
    case ojson::value_t::boolean: return "bool";
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned: return "int64";
    case ojson::value_t::number_float: return "double";
    case ojson::value_t::array: return "list<" + (v.empty() ? std::string("null") : json_type(v[0])) + ">";
    case ojson::value_t::object: {
      std::string s = "struct<";
      bool first = true;
      for (const auto& [k, x] : v.items()) s += (first ? "" : ", ") + k + ": " + json_type(x), first = false;
      return s + ">";
    }
    default: return "null";
  }
}

std::string shorten(std::string s, size_t n) {
  if (s.size() <= n) return s;
  size_t cut = n;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  return s.substr(0, cut) + " ...";
}

std::string megabytes(uintmax_t bytes) {
  if (bytes == static_cast<uintmax_t>(-1)) return "size unknown";
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

}  // namespace

void register_dataset_info(CLI::App& app) {
  auto* cmd = add_command(app, "dataset-info", "A dataset's splits, files, row counts, columns and first rows (hub id, folder or file)");
  struct Args {
    std::string name, config, revision = "main", split;
    int rows = 3;
    int width = 300;
  };
  auto a = std::make_shared<Args>();
  Options opts(cmd);
  add_positional(cmd, "name", a->name, "A Hugging Face dataset id (local cache), a folder, or a .parquet/.jsonl/.json file");
  opts.add("dataset_config,config", a->config, "Configuration (README.md `configs:` entry, or <config>/ folder)");
  opts.add("revision", a->revision, "Hub cache revision");
  opts.add("split", a->split, "Only this split");
  opts.add("rows", a->rows, "First rows to print per split").min(0);
  opts.add("width", a->width, "Characters of each printed row").min(20);
  on_run(cmd, [a] {
    const DatasetLayout layout = resolve_dataset(a->name, a->config, a->revision);
    std::printf("dataset %s\n  at %s\n", a->name.c_str(), layout.root.c_str());
    bool shown = false;
    for (const DatasetSplit& s : layout.splits) {
      if (!a->split.empty() && s.name != a->split && canonical_split_name(a->split) != s.name) continue;
      shown = true;
      const Dataset d = load_dataset(a->name, s.name, a->config, a->revision);
      std::printf("\nsplit %s: %zu rows in %zu file%s\n", s.name.c_str(), d.size(), s.files.size(), s.files.size() == 1 ? "" : "s");
      std::string columns;
      for (const std::string& f : s.files) {
        std::error_code ec;
        const std::string rel = std::filesystem::is_directory(layout.root, ec) ? std::filesystem::path(f).lexically_relative(layout.root).generic_string() : f;
        const uintmax_t bytes = std::filesystem::file_size(f, ec);
        if (std::filesystem::path(f).extension() == ".parquet") {
          const parquet::File pf = parquet::File::open(f);
          std::printf("  %s: %lld rows, %d row group%s, %s\n", rel.c_str(), static_cast<long long>(pf.num_rows()), pf.num_row_groups(),
                      pf.num_row_groups() == 1 ? "" : "s", megabytes(bytes).c_str());
          if (columns.empty())
            for (const auto& c : pf.columns()) columns += fmt::format("  {}: {}\n", c.name, c.type);
        } else {
          std::printf("  %s: %s\n", rel.c_str(), megabytes(bytes).c_str());
        }
      }
      if (columns.empty() && !d.empty()) {
        const ojson first = d.row(0);
        for (const auto& [k, v] : first.items()) columns += fmt::format("  {}: {}\n", k, json_type(v));
      }
      std::printf("columns:\n%s", columns.c_str());
      if (a->rows > 0) std::printf("first rows:\n");
      for (size_t i = 0; i < std::min(d.size(), static_cast<size_t>(a->rows)); ++i) {
        const std::string row = d.row(i).dump(-1, ' ', false, ojson::error_handler_t::replace);
        std::printf("  %s\n", shorten(row, static_cast<size_t>(a->width)).c_str());
      }
    }
    if (!shown) {
      std::string names;
      for (const auto& s : layout.splits) names += (names.empty() ? "" : ", ") + s.name;
      fail("dataset {}: no \"{}\" split; the splits are: {}", a->name, a->split, names);
    }
  });
}

}  // namespace trl::cli

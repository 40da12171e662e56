#include "trl/data/dataset.h"
#include "core/json_text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>

#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>

#include "core/fs.h"
#include "data/data_files.h"
#include "trl/core/error.h"
#include "trl/data/parquet.h"

namespace trl {

namespace {

namespace stdfs = std::filesystem;
using ojson = nlohmann::ordered_json;

void add_json_line(const std::string& line, const std::string& file, int64_t n, Dataset& out) {
  if (line.find_first_not_of(" \t\r") == std::string::npos) return;
  ojson j = parse_json<ojson>(line, fmt::format("{}:{}", file, n));
  if (!j.is_object()) fail("{}:{}: expected a JSON object per line, got {}", file, n, j.type_name());
  out.rows.push_back(std::move(j));
  out.where.push_back(fmt::format("{}:{}", file, n));
}

void read_jsonl(const std::string& file, Dataset& out) {
  std::ifstream in(file);
  if (!in) fail("{}: cannot open", file);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) add_json_line(line, file, n, out);
}

void read_json_text(const std::string& text, const std::string& file, Dataset& out) {
  const ojson j = parse_json<ojson>(text, file);
  if (!j.is_array()) fail("{}: expected a JSON array of objects", file);
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_object()) fail("{}[{}]: expected a JSON object, got {}", file, i, j[i].type_name());
    out.rows.push_back(j[i]);
    out.where.push_back(fmt::format("{}[{}]", file, i));
  }
}

void read_json(const std::string& file, Dataset& out) { read_json_text(read_text_file(file), file, out); }

// The text of a gzip-compressed file (.jsonl.gz, .json.gz), at most half the machine's memory; zlib's errors in the
// project's words, with the offset reached.
std::string read_gzip_text(const std::string& file) {
  const std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(file.c_str(), "rb"), gzclose);
  if (!f) fail("{}: cannot open", file);
  if (gzdirect(f.get())) fail("{}: not gzip-compressed, though its name ends in .gz: rename it or compress it with gzip", file);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const uint64_t cap = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2 : (uint64_t{8} << 30);
  std::string text;
  std::vector<char> chunk(1 << 20);
  for (;;) {
    const int n = gzread(f.get(), chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n > 0) text.append(chunk.data(), static_cast<size_t>(n));
    if (text.size() > cap)
      fail("{}: decompresses to more than {} GiB, half this machine's memory: split it into smaller files or convert it to Parquet", file, cap >> 30);
    int code = Z_OK;
    const char* why = gzerror(f.get(), &code);
    if (n < 0 || (code != Z_OK && code != Z_STREAM_END)) {
      std::string reason = why != nullptr && *why != '\0' ? why : "read error";
      if (reason.rfind(file + ": ", 0) == 0) reason = reason.substr(file.size() + 2);  // zlib puts the path first; it is named once
      fail("{}: the gzip data is damaged after {} decompressed bytes ({}): download or compress the file again", file, text.size(), reason);
    }
    if (n == 0) return text;
  }
}

// .jsonl.gz and .json.gz, as `datasets` reads them: decompressed, then as their uncompressed kind.
void read_gzip(const std::string& file, const std::string& kind, Dataset& out) {
  const std::string text = read_gzip_text(file);
  const size_t first = text.find_first_not_of(" \t\r\n\xEF\xBB\xBF");
  if (kind == "json" && first != std::string::npos && text[first] == '[') return read_json_text(text, file, out);
  int64_t n = 1;
  for (size_t at = 0; at < text.size(); ++n) {  // line by line, without a second copy of the text
    const size_t end = std::min(text.find('\n', at), text.size());
    add_json_line(text.substr(at, end - at), file, n, out);
    at = end + 1;
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
  if (is_gzip_file_name(file)) read_gzip(file, data_file_kind(file), out);
  else if (ext == ".parquet") out.add_parquet(parquet::File::open(file));
  else if (ext == ".json" && starts_with_array(file)) read_json(file, out);
  else read_jsonl(file, out);
}

}  // namespace

struct Dataset::ParquetPart {
  explicit ParquetPart(parquet::File f) : file(std::move(f)) {}
  parquet::File file;
  std::vector<int64_t> group_start;  // first row of each row group, then the file's row count
  std::mutex mu;                     // guards the decoded row group
  int group = -1;
  std::vector<ojson> rows;
};

size_t Dataset::size() const { return rows.size() + parquet_rows_; }

void Dataset::add_parquet(const parquet::File& file) {
  auto part = std::make_shared<ParquetPart>(file);
  int64_t at = 0;
  for (int g = 0; g < file.num_row_groups(); ++g) {
    part->group_start.push_back(at);
    at += file.row_group_rows(g);
  }
  part->group_start.push_back(at);
  parquet_start_.push_back(parquet_rows_);
  parquet_rows_ += static_cast<size_t>(at);
  parquet_.push_back(std::move(part));
}

ojson Dataset::row(size_t i) const {
  if (i < rows.size()) return rows[i];
  if (i >= size()) fail("dataset row {} of {}", i, size());
  const size_t k = i - rows.size();
  const size_t p = static_cast<size_t>(std::upper_bound(parquet_start_.begin(), parquet_start_.end(), k) - parquet_start_.begin()) - 1;
  ParquetPart& part = *parquet_[p];
  const auto r = static_cast<int64_t>(k - parquet_start_[p]);
  const int g = static_cast<int>(std::upper_bound(part.group_start.begin(), part.group_start.end(), r) - part.group_start.begin()) - 1;
  std::lock_guard<std::mutex> lock(part.mu);
  if (part.group != g) {
    part.rows.clear();
    part.group = -1;
    part.rows = part.file.read_row_group(g);
    part.group = g;
  }
  return part.rows[static_cast<size_t>(r - part.group_start[static_cast<size_t>(g)])];
}

std::string Dataset::location(size_t i) const {
  if (i < rows.size()) return i < where.size() ? where[i] : fmt::format("row {}", i + 1);
  if (i >= size()) return fmt::format("row {}", i + 1);
  const size_t k = i - rows.size();
  const size_t p = static_cast<size_t>(std::upper_bound(parquet_start_.begin(), parquet_start_.end(), k) - parquet_start_.begin()) - 1;
  const ParquetPart& part = *parquet_[p];
  const auto r = static_cast<int64_t>(k - parquet_start_[p]);
  const int g = static_cast<int>(std::upper_bound(part.group_start.begin(), part.group_start.end(), r) - part.group_start.begin()) - 1;
  return fmt::format("{}, row group {}, row {}", part.file.path(), g, r - part.group_start[static_cast<size_t>(g)]);
}

std::string Dataset::source_file() const {
  if (!rows.empty()) {
    if (where.empty()) return "";
    const std::string& w = where.front();
    if (const size_t b = w.rfind('['); b != std::string::npos && w.back() == ']') return w.substr(0, b);
    const size_t c = w.rfind(':');
    if (c == std::string::npos || c + 1 == w.size()) return w;
    for (size_t j = c + 1; j < w.size(); ++j)
      if (w[j] < '0' || w[j] > '9') return w;
    return w.substr(0, c);
  }
  return parquet_.empty() ? "" : parquet_.front()->file.path();
}

bool has_split(const std::string& name, const std::string& split, const std::string& config, const std::string& revision) {
  return !split_files(resolve_dataset(name, config, revision), split, false).empty();
}

Dataset load_dataset(const std::string& name, const std::string& split, const std::string& config, const std::string& revision) {
  std::error_code ec;
  if (stdfs::is_regular_file(name, ec) && split != "train")
    fail("dataset {}: a single file is the \"train\" split; there is no \"{}\" split", name, split);
  const DatasetLayout layout = resolve_dataset(name, config, revision);
  Dataset out;
  for (const auto& f : split_files(layout, split, true)) read_file(f, out);
  if (out.empty()) fail("dataset {}: the \"{}\" split has no rows", name, split);
  return out;
}

Dataset load_dataset_files(const std::string& name, const std::string& split, const std::string& data_dir, const DataFiles& data_files,
                           const std::string& revision) {
  const DatasetLayout layout = resolve_dataset_files(name, data_dir, data_files, revision);
  Dataset out;
  for (const auto& f : split_files(layout, split, true)) read_file(f, out);
  if (out.empty()) fail("dataset {}: the \"{}\" split has no rows", name, split);
  return out;
}

}  // namespace trl

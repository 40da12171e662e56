// trl::parquet::File: the footer, then one row group at a time, each column chunk a page at a time (docs/PARQUET.md).
//
//   open ─ footer (Thrift) ─ schema tree ─┐
//   read_row_group(g): for each leaf column: pages ─ decompress ─ levels + values ─ assemble into rows[g's rows]
//
// Record assembly: each leaf column's (repetition, definition, value) triplets are written into the rows by walking
// the leaf's chain of nodes; lists pick their element from the repetition level, nulls and empty lists stop at the
// node the definition level names. Columns under one list share its elements (the first creates them, later ones
// find them), so a list<struct<content, role>> comes out as one array of objects.
#include "trl/data/parquet.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "data/parquet/codec.h"
#include "data/parquet/schema.h"
#include "trl/core/error.h"

namespace trl::parquet {

namespace {

using ojson = nlohmann::ordered_json;

template <typename... Args>
[[noreturn]] void bad(fmt::format_string<Args...> f, Args&&... args) {
  throw DecodeError(fmt::format(f, std::forward<Args>(args)...));
}

// Where the bytes come from: a file read with pread, or memory.
class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  // Reads [offset, offset + n) into out (the caller checked the range against size()).
  virtual void read(uint64_t offset, size_t n, std::vector<uint8_t>& out) const = 0;
};

class FileSource : public Source {
 public:
  explicit FileSource(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail("{}: not a regular file", path);
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileSource() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, size_t n, std::vector<uint8_t>& out) const override {
    out.resize(n);
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, out.data() + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail("{}: read of {} bytes at offset {} failed: {}", path_, n, offset, got < 0 ? std::strerror(errno) : "the file is shorter than it was");
      done += static_cast<size_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

class MemorySource : public Source {
 public:
  explicit MemorySource(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, size_t n, std::vector<uint8_t>& out) const override {
    out.resize(n);
    if (n) std::memcpy(out.data(), bytes_.data() + offset, n);
  }

 private:
  std::string bytes_;
};

}  // namespace

struct File::Impl {
  std::string path;
  ReadLimits limits;
  std::unique_ptr<Source> source;
  FileMetaData meta;
  Schema schema;
};

namespace {

// ---- reading the footer ----

void read_footer(File::Impl& f) {
  const uint64_t size = f.source->size();
  if (size < 12) fail("{}: not a Parquet file ({} bytes; a Parquet file starts and ends with \"PAR1\")", f.path, size);
  std::vector<uint8_t> tail;
  f.source->read(size - 8, 8, tail);
  std::vector<uint8_t> head;
  f.source->read(0, 4, head);
  if (std::memcmp(tail.data() + 4, "PARE", 4) == 0) fail("{}: an encrypted Parquet file; encryption is not supported", f.path);
  if (std::memcmp(head.data(), "PAR1", 4) != 0 || std::memcmp(tail.data() + 4, "PAR1", 4) != 0)
    fail("{}: not a Parquet file (no \"PAR1\" magic at {}; the file may be truncated)", f.path, std::memcmp(head.data(), "PAR1", 4) ? "the start" : "the end");
  uint32_t footer_len;
  std::memcpy(&footer_len, tail.data(), 4);
  if (footer_len > size - 12) fail("{}: the footer claims {} bytes, the file has {} (truncated or corrupt)", f.path, footer_len, size);
  std::vector<uint8_t> footer;
  f.source->read(size - 8 - footer_len, footer_len, footer);
  try {
    CompactReader r(footer.data(), footer.size());
    f.meta = read_file_metadata(r);
  } catch (const ThriftError& e) {
    fail("{}: corrupt footer (FileMetaData): {}", f.path, e.what());
  }
  if (f.meta.encrypted) fail("{}: an encrypted Parquet file; encryption is not supported", f.path);
  try {
    build_schema(f.meta.schema, f.schema);
  } catch (const DecodeError& e) {
    fail("{}: bad schema: {}", f.path, e.what());
  }
  if (f.meta.num_rows < 0) fail("{}: the footer gives {} rows", f.path, f.meta.num_rows);
  int64_t rows = 0;
  for (size_t g = 0; g < f.meta.row_groups.size(); ++g) {
    const RowGroup& rg = f.meta.row_groups[g];
    if (rg.num_rows < 0) fail("{}: row group {} has {} rows", f.path, g, rg.num_rows);
    if (rg.columns.size() != f.schema.leaves.size())
      fail("{}: row group {} has {} column chunks, the schema has {} columns", f.path, g, rg.columns.size(), f.schema.leaves.size());
    rows += rg.num_rows;
    if (rows < 0) fail("{}: row counts overflow", f.path);
  }
  if (rows != f.meta.num_rows) fail("{}: the row groups hold {} rows, the footer says {}", f.path, rows, f.meta.num_rows);
}

// ---- one column chunk, page by page ----

// Decoded levels and values of one data page.
struct Page {
  std::vector<uint32_t> rep, def;  // empty when the column has no such levels
  size_t num_levels = 0;
  Values values;
};

class ChunkReader {
 public:
  ChunkReader(const File::Impl& f, const ColumnMetaData& m, const Leaf& leaf, int64_t& budget)
      : f_(f), m_(m), leaf_(leaf), budget_(budget) {
    const SchemaElement& e = *leaf.element;
    if (m.type != *e.type) bad("the column chunk holds {} values, the schema says {}", physical_type_name(m.type), physical_type_name(*e.type));
    int64_t start = m.data_page_offset;
    if (m.dictionary_page_offset && *m.dictionary_page_offset > 0 && *m.dictionary_page_offset < start) start = *m.dictionary_page_offset;
    const uint64_t size = f.source->size();
    if (start < 4 || m.total_compressed_size < 0 || static_cast<uint64_t>(start) > size - 8 ||
        static_cast<uint64_t>(m.total_compressed_size) > size - 8 - static_cast<uint64_t>(start))
      bad("the column chunk's bytes [{}, +{}) lie outside the file's {} bytes", start, m.total_compressed_size, size);
    pos_ = static_cast<uint64_t>(start);
    end_ = pos_ + static_cast<uint64_t>(m.total_compressed_size);
    dict_.type = *e.type;
  }

  // The next data page, or false at the end of the chunk.
  bool next(Page& page) {
    while (pos_ < end_) {
      ++page_index_;
      const PageHeader h = read_header();
      if (h.compressed_page_size < 0 || h.uncompressed_page_size < 0) bad("page {}: negative page size", page_index_);
      if (h.compressed_page_size > f_.limits.max_page_bytes || h.uncompressed_page_size > f_.limits.max_page_bytes)
        bad("page {}: {} bytes ({} uncompressed) is past the limit of {} bytes per page", page_index_, h.compressed_page_size, h.uncompressed_page_size,
            f_.limits.max_page_bytes);
      if (static_cast<uint64_t>(h.compressed_page_size) > end_ - pos_)
        bad("page {}: {} bytes, {} left in the column chunk (truncated or corrupt)", page_index_, h.compressed_page_size, end_ - pos_);
      f_.source->read(pos_, static_cast<size_t>(h.compressed_page_size), raw_);
      pos_ += static_cast<uint64_t>(h.compressed_page_size);
      switch (h.type) {
        case PageType::Dictionary: read_dictionary(h); continue;
        case PageType::Data: read_data_v1(h, page); return true;
        case PageType::DataV2: read_data_v2(h, page); return true;
        case PageType::Index: continue;
      }
      bad("page {}: unknown page type {}", page_index_, static_cast<int>(h.type));
    }
    return false;
  }

  int page_index() const { return page_index_; }

 private:
  PageHeader read_header() {
    // Headers are small, but statistics may make one long: read a window, widen it if the header runs past it.
    size_t window = static_cast<size_t>(std::min<uint64_t>(end_ - pos_, 1024));
    while (true) {
      f_.source->read(pos_, window, header_buf_);
      try {
        CompactReader r(header_buf_.data(), header_buf_.size());
        PageHeader h = read_page_header(r);
        pos_ += r.offset();
        return h;
      } catch (const ThriftError& e) {
        const uint64_t left = end_ - pos_;
        if (window >= left || window >= (size_t{1} << 24)) bad("page {}: corrupt page header: {}", page_index_, e.what());
        window = static_cast<size_t>(std::min<uint64_t>(left, window * 8));
      }
    }
  }

  Bytes decompress_all(const PageHeader& h) {
    decompress(m_.codec, Bytes{raw_.data(), raw_.size()}, static_cast<size_t>(h.uncompressed_page_size), body_);
    return Bytes{body_.data(), body_.size()};
  }

  void take_budget(int64_t n) {
    if (n < 0) bad("page {}: {} values", page_index_, n);
    budget_ -= n;
    if (budget_ < 0) bad("the row group expands to more than {} values (ReadLimits::max_values_per_row_group)", f_.limits.max_values_per_row_group);
  }

  void read_dictionary(const PageHeader& h) {
    if (!h.dictionary) bad("page {}: a dictionary page without its header", page_index_);
    if (h.dictionary->encoding != Encoding::Plain && h.dictionary->encoding != Encoding::PlainDictionary)
      bad("page {}: a dictionary encoded as {}", page_index_, encoding_name(h.dictionary->encoding));
    take_budget(h.dictionary->num_values);
    const Bytes body = decompress_all(h);
    dict_buf_.swap(body_);  // the dictionary's byte strings point into its buffer: keep it for the chunk
    dict_.clear();
    decode_plain(Bytes{dict_buf_.data(), dict_buf_.size()}, *leaf_.element->type, leaf_.element->type_length, static_cast<size_t>(h.dictionary->num_values), dict_);
    (void)body;
    have_dict_ = true;
  }

  void read_levels_rle(Bytes in, int max_level, size_t n, std::vector<uint32_t>& out, const char* what) {
    out.resize(n);
    decode_rle_hybrid(in, bit_width_of(static_cast<uint32_t>(max_level)), n, out.data());
    for (size_t i = 0; i < n; ++i)
      if (out[i] > static_cast<uint32_t>(max_level)) bad("page {}: {} level {} at entry {} is past the column's maximum {}", page_index_, what, out[i], i, max_level);
  }

  size_t count_present(const Page& p) const {
    if (leaf_.max_def == 0) return p.num_levels;
    size_t n = 0;
    for (uint32_t d : p.def) n += d == static_cast<uint32_t>(leaf_.max_def);
    return n;
  }

  void read_data_v1(const PageHeader& h, Page& page) {
    if (!h.data) bad("page {}: a data page without its header", page_index_);
    const DataPageHeader& d = *h.data;
    take_budget(d.num_values);
    const Bytes body = decompress_all(h);
    page.num_levels = static_cast<size_t>(d.num_values);
    size_t off = 0;
    auto levels = [&](int max_level, Encoding enc, std::vector<uint32_t>& out, const char* what) {
      out.clear();
      if (max_level == 0) return;
      if (enc != Encoding::Rle) bad("page {}: {} levels encoded as {} (only RLE is supported)", page_index_, what, encoding_name(enc));
      const Bytes len_bytes = body.sub(off, 4);
      uint32_t len;
      std::memcpy(&len, len_bytes.data, 4);
      read_levels_rle(body.sub(off + 4, len), max_level, page.num_levels, out, what);
      off += 4 + len;
    };
    levels(leaf_.max_rep, d.repetition_level_encoding, page.rep, "repetition");
    levels(leaf_.max_def, d.definition_level_encoding, page.def, "definition");
    read_values(body.sub(off, body.size - off), d.encoding, count_present(page), page);
  }

  void read_data_v2(const PageHeader& h, Page& page) {
    if (!h.data_v2) bad("page {}: a v2 data page without its header", page_index_);
    const DataPageHeaderV2& d = *h.data_v2;
    take_budget(d.num_values);
    page.num_levels = static_cast<size_t>(d.num_values);
    const Bytes raw{raw_.data(), raw_.size()};
    if (d.repetition_levels_byte_length < 0 || d.definition_levels_byte_length < 0) bad("page {}: negative level lengths", page_index_);
    const size_t rl = static_cast<size_t>(d.repetition_levels_byte_length), dl = static_cast<size_t>(d.definition_levels_byte_length);
    const Bytes rep = raw.sub(0, rl), def = raw.sub(rl, dl);
    page.rep.clear();
    page.def.clear();
    if (leaf_.max_rep > 0) read_levels_rle(rep, leaf_.max_rep, page.num_levels, page.rep, "repetition");
    if (leaf_.max_def > 0) read_levels_rle(def, leaf_.max_def, page.num_levels, page.def, "definition");
    const Bytes values = raw.sub(rl + dl, raw.size - rl - dl);
    if (static_cast<size_t>(h.uncompressed_page_size) < rl + dl) bad("page {}: levels longer than the page", page_index_);
    const size_t values_size = static_cast<size_t>(h.uncompressed_page_size) - rl - dl;
    Bytes v = values;
    if (d.is_compressed && m_.codec != Codec::Uncompressed) {
      decompress(m_.codec, values, values_size, body_);
      v = Bytes{body_.data(), body_.size()};
    } else if (values.size != values_size) {
      bad("page {}: {} value bytes, the header declares {}", page_index_, values.size, values_size);
    }
    read_values(v, d.encoding, count_present(page), page);
  }

  void read_values(Bytes in, Encoding enc, size_t count, Page& page) {
    page.values.clear();
    page.values.type = *leaf_.element->type;
    if (enc == Encoding::PlainDictionary || enc == Encoding::RleDictionary) {
      if (!have_dict_) bad("page {}: dictionary-encoded values and no dictionary page", page_index_);
      if (count == 0) return;
      if (in.size < 1) bad("page {}: no bit width for the dictionary indices", page_index_);
      const int w = in.data[0];
      if (w > 32) bad("page {}: dictionary indices of {} bits", page_index_, w);
      indices_.resize(count);
      decode_rle_hybrid(in.sub(1, in.size - 1), w, count, indices_.data());
      gather_dictionary(dict_, indices_.data(), count, page.values);
      return;
    }
    decode_values(in, enc, *leaf_.element->type, leaf_.element->type_length, count, page.values);
    if (page.values.size() != count) bad("page {}: {} values decoded, {} expected", page_index_, page.values.size(), count);
  }

  const File::Impl& f_;
  const ColumnMetaData& m_;
  const Leaf& leaf_;
  int64_t& budget_;
  uint64_t pos_ = 0, end_ = 0;
  int page_index_ = -1;
  std::vector<uint8_t> raw_, body_, header_buf_, dict_buf_;
  std::vector<uint32_t> indices_;
  Values dict_;
  bool have_dict_ = false;
};

// ---- record assembly ----

class Assembler {
 public:
  Assembler(const Leaf& leaf, std::vector<ojson>& rows) : leaf_(leaf), rows_(rows), index_(static_cast<size_t>(leaf.max_rep) + 1, 0) {}

  void add(const Page& p) {
    size_t vi = 0;
    for (size_t i = 0; i < p.num_levels; ++i) {
      const int r = p.rep.empty() ? 0 : static_cast<int>(p.rep[i]);
      const int d = p.def.empty() ? leaf_.max_def : static_cast<int>(p.def[i]);
      if (r == 0) {
        if (++row_ >= static_cast<int64_t>(rows_.size())) bad("the column holds more rows than the row group's {}", rows_.size());
      } else if (row_ < 0) {
        bad("the column's first entry continues a row (repetition level {})", r);
      }
      place(r, d, p.values, vi);
    }
    if (vi != p.values.size()) bad("{} values for {} present entries", p.values.size(), vi);
  }

  int64_t rows_seen() const { return row_ + 1; }

 private:
  static ojson& field(ojson& object, const std::string& name) {
    auto& obj = object.get_ref<ojson::object_t&>();
    return obj.emplace(name, nullptr).first->second;
  }

  [[noreturn]] void disagree(const Node& n) const {
    bad("row {}: the column disagrees with an earlier column on the shape of '{}'", row_, n.name);
  }

  // Writes one (r, d, value) entry into rows_[row_] along the leaf's chain.
  void place(int r, int d, const Values& values, size_t& vi) {
    ojson* slot = &rows_[static_cast<size_t>(row_)];
    if (slot->is_null()) *slot = ojson::object();
    const auto& chain = leaf_.chain;
    for (size_t k = 1; k < chain.size(); ++k) {
      const Node& parent = *chain[k - 1];
      const Node& n = *chain[k];
      if (parent.kind == Node::Kind::Struct) {
        slot = &field(*slot, n.name);
      } else {  // an element of a list or map: which one, from the repetition level
        size_t& idx = index_[static_cast<size_t>(parent.elem_rep)];
        if (r < parent.elem_rep) idx = 0;
        else if (r == parent.elem_rep) ++idx;
        auto& arr = slot->get_ref<ojson::array_t&>();
        if (idx == arr.size()) arr.emplace_back(nullptr);
        else if (idx > arr.size()) bad("row {}: list '{}' skips from {} to element {}", row_, parent.name, arr.size(), idx);
        slot = &arr[idx];
      }
      if (d < n.def) {  // null here
        if (!slot->is_null()) disagree(n);
        return;
      }
      switch (n.kind) {
        case Node::Kind::Leaf:
          if (vi >= values.size()) bad("more present entries than the page's {} values", values.size());
          *slot = leaf_value(*leaf_.element, values, vi++);
          return;
        case Node::Kind::Struct:
          if (slot->is_null()) {
            *slot = ojson::object();
            slot->get_ref<ojson::object_t&>().reserve(n.children.size());  // no regrowth: keys are copied when it moves
          } else if (!slot->is_object()) {
            disagree(n);
          }
          break;
        case Node::Kind::List:
        case Node::Kind::Map:
          if (slot->is_null()) *slot = ojson::array();
          else if (!slot->is_array()) disagree(n);
          if (d < n.nonempty_def) return;  // an empty list
          break;
      }
    }
  }

  const Leaf& leaf_;
  std::vector<ojson>& rows_;
  std::vector<size_t> index_;  // per repetition level: the element being written
  int64_t row_ = -1;
};

// Maps were assembled as arrays of {key, value}: string-keyed ones become JSON objects (as `datasets` gives dicts).
void convert_maps(const Node& n, ojson& v) {
  if (v.is_null()) return;
  switch (n.kind) {
    case Node::Kind::Leaf: return;
    case Node::Kind::Struct:
      for (const Node& c : n.children)
        if (auto it = v.find(c.name); it != v.end()) convert_maps(c, *it);
      return;
    case Node::Kind::List:
      for (ojson& e : v) convert_maps(n.children[0], e);
      return;
    case Node::Kind::Map: {
      const Node& key = n.children[0].children[0];
      const Node& value = n.children[0].children[1];
      bool string_keys = true;
      for (ojson& e : v) {
        if (!e.is_object()) return;
        if (auto it = e.find(value.name); it != e.end()) convert_maps(value, *it);
        auto k = e.find(key.name);
        string_keys = string_keys && k != e.end() && k->is_string();
      }
      if (!string_keys) return;  // other keys stay a list of {key, value} objects
      ojson obj = ojson::object();
      for (ojson& e : v) {
        auto it = e.find(value.name);
        obj[e[key.name].get<std::string>()] = it == e.end() ? ojson() : std::move(*it);
      }
      v = std::move(obj);
      return;
    }
  }
}

bool has_map(const Node& n) {
  if (n.kind == Node::Kind::Map) return true;
  for (const Node& c : n.children)
    if (has_map(c)) return true;
  return false;
}

std::vector<ojson> read_group(const File::Impl& f, int g) {
  const RowGroup& rg = f.meta.row_groups[static_cast<size_t>(g)];
  if (rg.num_rows > f.limits.max_values_per_row_group)
    fail("{}: row group {} has {} rows, past the limit of {} (ReadLimits::max_values_per_row_group)", f.path, g, rg.num_rows, f.limits.max_values_per_row_group);
  std::vector<ojson> rows(static_cast<size_t>(rg.num_rows), ojson::object());
  for (ojson& row : rows) row.get_ref<ojson::object_t&>().reserve(f.schema.root.children.size());
  int64_t budget = f.limits.max_values_per_row_group;
  Page page;
  for (size_t c = 0; c < f.schema.leaves.size(); ++c) {
    const Leaf& leaf = f.schema.leaves[c];
    const ColumnChunk& chunk = rg.columns[c];
    int page_index = -1;
    try {
      if (!chunk.file_path.empty()) bad("the column chunk lives in another file ({}), which is not supported", chunk.file_path);
      if (chunk.encrypted) bad("the column chunk is encrypted, which is not supported");
      if (!chunk.meta) bad("the column chunk has no metadata");
      ChunkReader reader(f, *chunk.meta, leaf, budget);
      Assembler assembler(leaf, rows);
      while (reader.next(page)) {
        page_index = reader.page_index();
        assembler.add(page);
      }
      if (assembler.rows_seen() != rg.num_rows) bad("the column holds {} rows, the row group {}", assembler.rows_seen(), rg.num_rows);
    } catch (const DecodeError& e) {
      fail("{}: row group {}, column '{}'{}: {}", f.path, g, leaf.path, page_index >= 0 ? fmt::format(" (after page {})", page_index) : "", e.what());
    } catch (const ojson::exception& e) {
      fail("{}: row group {}, column '{}': the column's nesting does not fit its schema ({})", f.path, g, leaf.path, e.what());
    }
  }
  if (has_map(f.schema.root))
    for (ojson& row : rows) convert_maps(f.schema.root, row);
  return rows;
}

}  // namespace

File File::open(const std::string& path, ReadLimits limits) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->limits = limits;
  impl->source = std::make_unique<FileSource>(path);
  read_footer(*impl);
  File f;
  f.impl_ = std::move(impl);
  return f;
}

File File::from_bytes(std::string bytes, const std::string& name, ReadLimits limits) {
  auto impl = std::make_shared<Impl>();
  impl->path = name;
  impl->limits = limits;
  impl->source = std::make_unique<MemorySource>(std::move(bytes));
  read_footer(*impl);
  File f;
  f.impl_ = std::move(impl);
  return f;
}

const std::string& File::path() const { return impl_->path; }
int64_t File::num_rows() const { return impl_->meta.num_rows; }
int File::num_row_groups() const { return static_cast<int>(impl_->meta.row_groups.size()); }
int64_t File::row_group_rows(int g) const { return impl_->meta.row_groups.at(static_cast<size_t>(g)).num_rows; }
int64_t File::row_group_bytes(int g) const { return impl_->meta.row_groups.at(static_cast<size_t>(g)).total_byte_size; }
const std::string& File::created_by() const { return impl_->meta.created_by; }

std::vector<ColumnInfo> File::columns() const {
  std::vector<ColumnInfo> out;
  for (const Node& c : impl_->schema.root.children) out.push_back({c.name, type_string(c, impl_->schema.leaves)});
  return out;
}

std::vector<ojson> File::read_row_group(int g) const {
  if (g < 0 || g >= num_row_groups()) fail("{}: no row group {} (the file has {})", impl_->path, g, num_row_groups());
  return read_group(*impl_, g);
}

}  // namespace trl::parquet

// trl::parquet::File: the footer, then one row group at a time, each column chunk a page at a time (docs/PARQUET.md).
//
//   open ─ footer (Thrift) ─ schema tree ─┐
//   read_row_group(g): for each leaf column: pages ─ decompress ─ levels + values ─ assemble into rows[g's rows]
//
// The parts: source.h (pread or memory), column_reader.h (a chunk's pages as levels and values), assemble.h (record
// assembly into JSON rows), schema.h (the schema tree), encoding.h / codec.h (values, pages), metadata.h (Thrift).
#include "trl/data/parquet.h"

#include <cstring>

#include <fmt/format.h>

#include "data/parquet/assemble.h"
#include "data/parquet/column_reader.h"
#include "data/parquet/source.h"
#include "trl/core/error.h"

namespace trl::parquet {

namespace {

using ojson = nlohmann::ordered_json;

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
  if (footer_len > f.limits.max_footer_bytes)
    fail("{}: a footer of {} bytes, past the limit of {} (ReadLimits::max_footer_bytes)", f.path, footer_len, f.limits.max_footer_bytes);
  std::vector<uint8_t> footer;
  f.source->read(size - 8 - footer_len, footer_len, footer);
  try {
    CompactReader r(footer.data(), footer.size());
    f.meta = read_file_metadata(r);
  } catch (const ThriftError& e) {
    fail("{}: corrupt footer (FileMetaData): {}", f.path, e.what());
  } catch (const std::bad_alloc&) {
    fail("{}: the footer (FileMetaData) needs more memory than there is", f.path);
  }
  if (f.meta.row_groups.size() > static_cast<size_t>(INT32_MAX)) fail("{}: {} row groups", f.path, f.meta.row_groups.size());
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
    if (__builtin_add_overflow(rows, rg.num_rows, &rows)) fail("{}: the row groups' row counts overflow", f.path);
    for (size_t c = 0; c < rg.columns.size(); ++c) {  // chunks in schema order: a path out of place would misread silently
      if (!rg.columns[c].meta || rg.columns[c].meta->path_in_schema.empty()) continue;
      std::string path;
      for (const auto& part : rg.columns[c].meta->path_in_schema) path += (path.empty() ? "" : ".") + part;
      if (path != f.schema.leaves[c].path)
        fail("{}: row group {}: column chunk {} is '{}', the schema's column {} is '{}'", f.path, g, c, path, c, f.schema.leaves[c].path);
    }
  }
  if (rows != f.meta.num_rows) fail("{}: the row groups hold {} rows, the footer says {}", f.path, rows, f.meta.num_rows);
}

std::vector<ojson> read_group(const File::Impl& f, int g) {
  const RowGroup& rg = f.meta.row_groups[static_cast<size_t>(g)];
  if (rg.num_rows > f.limits.max_values_per_row_group)
    fail("{}: row group {} has {} rows, past the limit of {} (ReadLimits::max_values_per_row_group)", f.path, g, rg.num_rows, f.limits.max_values_per_row_group);
  std::vector<ojson> rows;  // made by the first column as its rows appear (the footer's count is only a promise)
  rows.reserve(static_cast<size_t>(std::min<int64_t>(rg.num_rows, 1 << 16)));
  RowGroupBudget budget{f.limits};
  Page page;
  for (size_t c = 0; c < f.schema.leaves.size(); ++c) {
    const Leaf& leaf = f.schema.leaves[c];
    const ColumnChunk& chunk = rg.columns[c];
    int page_index = -1;
    try {
      if (!chunk.file_path.empty()) decode_error("the column chunk lives in another file ({}), which is not supported", chunk.file_path);
      if (chunk.encrypted) decode_error("the column chunk is encrypted, which is not supported");
      if (!chunk.meta) decode_error("the column chunk has no metadata");
      ChunkReader reader(*f.source, f.limits, *chunk.meta, leaf, budget);
      Assembler assembler(leaf, rows, rg.num_rows, f.schema.root.children.size(), c == 0, budget);
      while (reader.next(page)) {
        page_index = reader.page_index();
        assembler.add(page);
      }
      if (assembler.rows_seen() != rg.num_rows) decode_error("the column holds {} rows, the row group {}", assembler.rows_seen(), rg.num_rows);
    } catch (const DecodeError& e) {
      fail("{}: row group {}, column '{}'{}: {}", f.path, g, leaf.path, page_index >= 0 ? fmt::format(" (after page {})", page_index) : "", e.what());
    } catch (const std::bad_alloc&) {
      fail("{}: row group {}, column '{}': out of memory (the file asks for more than this machine has; ReadLimits bounds it)", f.path, g, leaf.path);
    } catch (const std::length_error& e) {
      fail("{}: row group {}, column '{}': a size past what can be allocated ({})", f.path, g, leaf.path, e.what());
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
int64_t File::row_group_rows(int g) const {
  if (g < 0 || g >= num_row_groups()) fail("{}: no row group {} (the file has {})", impl_->path, g, num_row_groups());
  return impl_->meta.row_groups[static_cast<size_t>(g)].num_rows;
}
int64_t File::row_group_bytes(int g) const {
  if (g < 0 || g >= num_row_groups()) fail("{}: no row group {} (the file has {})", impl_->path, g, num_row_groups());
  return impl_->meta.row_groups[static_cast<size_t>(g)].total_byte_size;
}
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

// One column chunk of a row group, read a page at a time (column_reader.cpp): each data page comes out as its
// repetition and definition levels and its decoded values, the dictionary kept for the chunk.
#pragma once

#include <cstdint>
#include <vector>

#include "data/parquet/codec.h"
#include "data/parquet/encoding.h"
#include "data/parquet/schema.h"
#include "data/parquet/source.h"
#include "trl/data/parquet.h"

namespace trl::parquet {

// What one row group may still decode (ReadLimits): level entries of all its columns, and bytes of its rows.
struct RowGroupBudget {
  const ReadLimits& limits;
  int64_t values = limits.max_values_per_row_group;
  int64_t bytes = limits.max_bytes_per_row_group;
  void take_values(int64_t n) {
    if (n < 0) decode_error("{} values", n);
    values -= n;
    if (values < 0) decode_error("the row group expands to more than {} values (ReadLimits::max_values_per_row_group)", limits.max_values_per_row_group);
  }
  void take_bytes(int64_t n) {
    bytes -= n;
    if (bytes < 0) decode_error("the row group's rows grow past {} bytes (ReadLimits::max_bytes_per_row_group)", limits.max_bytes_per_row_group);
  }
};

// Decoded levels and values of one data page.
struct Page {
  std::vector<uint32_t> rep, def;  // empty when the column has no such levels
  size_t num_levels = 0;
  Values values;
};

class ChunkReader {
 public:
  ChunkReader(const Source& source, const ReadLimits& limits, const ColumnMetaData& m, const Leaf& leaf, RowGroupBudget& budget)
      : source_(source), limits_(limits), m_(m), leaf_(leaf), budget_(budget) {
    const SchemaElement& e = *leaf.element;
    if (m.type != *e.type) decode_error("the column chunk holds {} values, the schema says {}", physical_type_name(m.type), physical_type_name(*e.type));
    int64_t start = m.data_page_offset;
    if (m.dictionary_page_offset && *m.dictionary_page_offset > 0 && *m.dictionary_page_offset < start) start = *m.dictionary_page_offset;
    const uint64_t size = source.size();
    if (start < 4 || m.total_compressed_size < 0 || static_cast<uint64_t>(start) > size - 8 ||
        static_cast<uint64_t>(m.total_compressed_size) > size - 8 - static_cast<uint64_t>(start))
      decode_error("the column chunk's bytes [{}, +{}) lie outside the file's {} bytes", start, m.total_compressed_size, size);
    pos_ = static_cast<uint64_t>(start);
    end_ = pos_ + static_cast<uint64_t>(m.total_compressed_size);
    dict_.type = *e.type;
  }

  // The next data page, or false at the end of the chunk.
  bool next(Page& page) {
    while (pos_ < end_) {
      ++page_index_;
      const PageHeader h = read_header();
      if (h.compressed_page_size < 0 || h.uncompressed_page_size < 0) decode_error("page {}: negative page size", page_index_);
      if (h.compressed_page_size > limits_.max_page_bytes || h.uncompressed_page_size > limits_.max_page_bytes)
        decode_error("page {}: {} bytes ({} uncompressed) is past the limit of {} bytes per page", page_index_, h.compressed_page_size, h.uncompressed_page_size,
            limits_.max_page_bytes);
      if (static_cast<uint64_t>(h.compressed_page_size) > end_ - pos_)
        decode_error("page {}: {} bytes, {} left in the column chunk (truncated or corrupt)", page_index_, h.compressed_page_size, end_ - pos_);
      source_.read(pos_, static_cast<size_t>(h.compressed_page_size), raw_);
      pos_ += static_cast<uint64_t>(h.compressed_page_size);
      switch (h.type) {
        case PageType::Dictionary: read_dictionary(h); continue;
        case PageType::Data: read_data_v1(h, page); return true;
        case PageType::DataV2: read_data_v2(h, page); return true;
        case PageType::Index: continue;
      }
      decode_error("page {}: unknown page type {}", page_index_, static_cast<int>(h.type));
    }
    return false;
  }

  int page_index() const { return page_index_; }

 private:
  PageHeader read_header() {
    // Headers are small, but statistics may make one long: read a window, widen it if the header runs past it.
    size_t window = static_cast<size_t>(std::min<uint64_t>(end_ - pos_, 1024));
    while (true) {
      source_.read(pos_, window, header_buf_);
      try {
        CompactReader r(header_buf_.data(), header_buf_.size());
        PageHeader h = read_page_header(r);
        pos_ += r.offset();
        return h;
      } catch (const ThriftError& e) {
        const uint64_t left = end_ - pos_;
        if (window >= left || window >= (size_t{1} << 24)) decode_error("page {}: corrupt page header: {}", page_index_, e.what());
        window = static_cast<size_t>(std::min<uint64_t>(left, window * 8));
      }
    }
  }

  Bytes decompress_all(const PageHeader& h) {
    decompress(m_.codec, Bytes{raw_.data(), raw_.size()}, static_cast<size_t>(h.uncompressed_page_size), body_);
    return Bytes{body_.data(), body_.size()};
  }

  void take_budget(int64_t n) {
    if (n < 0) decode_error("page {}: {} values", page_index_, n);
    budget_.take_values(n);
  }

  void read_dictionary(const PageHeader& h) {
    if (!h.dictionary) decode_error("page {}: a dictionary page without its header", page_index_);
    if (h.dictionary->encoding != Encoding::Plain && h.dictionary->encoding != Encoding::PlainDictionary)
      decode_error("page {}: a dictionary encoded as {}", page_index_, encoding_name(h.dictionary->encoding));
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
      if (out[i] > static_cast<uint32_t>(max_level)) decode_error("page {}: {} level {} at entry {} is past the column's maximum {}", page_index_, what, out[i], i, max_level);
  }

  size_t count_present(const Page& p) const {
    if (leaf_.max_def == 0) return p.num_levels;
    size_t n = 0;
    for (uint32_t d : p.def) n += d == static_cast<uint32_t>(leaf_.max_def);
    return n;
  }

  void read_data_v1(const PageHeader& h, Page& page) {
    if (!h.data) decode_error("page {}: a data page without its header", page_index_);
    const DataPageHeader& d = *h.data;
    take_budget(d.num_values);
    const Bytes body = decompress_all(h);
    page.num_levels = static_cast<size_t>(d.num_values);
    size_t off = 0;
    auto levels = [&](int max_level, Encoding enc, std::vector<uint32_t>& out, const char* what) {
      out.clear();
      if (max_level == 0) return;
      if (enc != Encoding::Rle) decode_error("page {}: {} levels encoded as {} (only RLE is supported)", page_index_, what, encoding_name(enc));
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
    if (!h.data_v2) decode_error("page {}: a v2 data page without its header", page_index_);
    const DataPageHeaderV2& d = *h.data_v2;
    take_budget(d.num_values);
    page.num_levels = static_cast<size_t>(d.num_values);
    const Bytes raw{raw_.data(), raw_.size()};
    if (d.repetition_levels_byte_length < 0 || d.definition_levels_byte_length < 0) decode_error("page {}: negative level lengths", page_index_);
    const size_t rl = static_cast<size_t>(d.repetition_levels_byte_length), dl = static_cast<size_t>(d.definition_levels_byte_length);
    const Bytes rep = raw.sub(0, rl), def = raw.sub(rl, dl);
    page.rep.clear();
    page.def.clear();
    if (leaf_.max_rep > 0) read_levels_rle(rep, leaf_.max_rep, page.num_levels, page.rep, "repetition");
    if (leaf_.max_def > 0) read_levels_rle(def, leaf_.max_def, page.num_levels, page.def, "definition");
    const Bytes values = raw.sub(rl + dl, raw.size - rl - dl);
    if (static_cast<size_t>(h.uncompressed_page_size) < rl + dl) decode_error("page {}: levels longer than the page", page_index_);
    const size_t values_size = static_cast<size_t>(h.uncompressed_page_size) - rl - dl;
    Bytes v = values;
    if (d.is_compressed && m_.codec != Codec::Uncompressed) {
      decompress(m_.codec, values, values_size, body_);
      v = Bytes{body_.data(), body_.size()};
    } else if (values.size != values_size) {
      decode_error("page {}: {} value bytes, the header declares {}", page_index_, values.size, values_size);
    }
    read_values(v, d.encoding, count_present(page), page);
  }

  void read_values(Bytes in, Encoding enc, size_t count, Page& page) {
    page.values.clear();
    page.values.type = *leaf_.element->type;
    if (enc == Encoding::PlainDictionary || enc == Encoding::RleDictionary) {
      if (!have_dict_) decode_error("page {}: dictionary-encoded values and no dictionary page", page_index_);
      if (count == 0) return;
      if (in.size < 1) decode_error("page {}: no bit width for the dictionary indices", page_index_);
      const int w = in.data[0];
      if (w > 32) decode_error("page {}: dictionary indices of {} bits", page_index_, w);
      indices_.resize(count);
      decode_rle_hybrid(in.sub(1, in.size - 1), w, count, indices_.data());
      gather_dictionary(dict_, indices_.data(), count, page.values);
      return;
    }
    decode_values(in, enc, *leaf_.element->type, leaf_.element->type_length, count, page.values, static_cast<size_t>(std::max<int64_t>(budget_.bytes, 0)));
    if (page.values.size() != count) decode_error("page {}: {} values decoded, {} expected", page_index_, page.values.size(), count);
  }

  const Source& source_;
  const ReadLimits& limits_;
  const ColumnMetaData& m_;
  const Leaf& leaf_;
  RowGroupBudget& budget_;
  uint64_t pos_ = 0, end_ = 0;
  int page_index_ = -1;
  std::vector<uint8_t> raw_, body_, header_buf_, dict_buf_;
  std::vector<uint32_t> indices_;
  Values dict_;
  bool have_dict_ = false;
};

}  // namespace trl::parquet

#include "data/parquet/metadata.h"

#include <string>

namespace trl::parquet {

namespace {

using Field = CompactReader::Field;

// Calls on_field(f) for each field of the struct at the reader's position; on_field returns false for an id it does
// not know, and that field is skipped.
template <typename F>
void read_struct(CompactReader& r, F&& on_field) {
  r.begin_struct();
  Field f;
  while (r.next_field(f))
    if (!on_field(f)) r.skip(f.type);
  r.end_struct();
}

void expect(CompactReader& r, const Field& f, TType t, const char* what) {
  const bool is_bool = t == TType::True || t == TType::False;
  const bool got_bool = f.type == TType::True || f.type == TType::False;
  if (is_bool ? !got_bool : f.type != t)
    r.error(std::string(what) + " (field " + std::to_string(f.id) + ") has type " + std::to_string(static_cast<int>(f.type)));
}

int32_t read_i32(CompactReader& r, const Field& f, const char* what) {
  expect(r, f, TType::I32, what);
  return r.i32();
}
int64_t read_i64(CompactReader& r, const Field& f, const char* what) {
  expect(r, f, TType::I64, what);
  return r.i64();
}
std::string read_string(CompactReader& r, const Field& f, const char* what) {
  expect(r, f, TType::Binary, what);
  return std::string(r.binary());
}
// A list of structs: each element read by `element`.
template <typename F>
void read_list(CompactReader& r, const Field& f, TType elem_type, const char* what, F&& element) {
  expect(r, f, TType::List, what);
  TType t;
  const uint32_t n = r.list(t);
  if (n > 0 && t != elem_type) r.error(std::string(what) + ": list elements of type " + std::to_string(static_cast<int>(t)));
  for (uint32_t i = 0; i < n; ++i) element();
}

void read_logical_type(CompactReader& r, SchemaElement& e) {
  read_struct(r, [&](const Field& f) {
    if (f.type != TType::Struct) return false;
    switch (f.id) {
      case 1: e.logical = Logical::String; break;
      case 2: e.logical = Logical::Map; break;
      case 3: e.logical = Logical::List; break;
      case 4: e.logical = Logical::Enum; break;
      case 5:
        e.logical = Logical::Decimal;
        read_struct(r, [&](const Field& g) {
          if (g.id == 1) return e.scale = read_i32(r, g, "DecimalType.scale"), true;
          if (g.id == 2) return e.precision = read_i32(r, g, "DecimalType.precision"), true;
          return false;
        });
        return true;
      case 6: e.logical = Logical::Date; break;
      case 7: e.logical = Logical::Time; break;
      case 8: e.logical = Logical::Timestamp; break;
      case 10:
        e.logical = Logical::Integer;
        read_struct(r, [&](const Field& g) {
          if (g.id == 1 && g.type == TType::Byte) return e.int_bit_width = r.i8(), true;
          if (g.id == 2) return expect(r, g, TType::True, "IntType.isSigned"), e.int_signed = g.bool_value, true;
          return false;
        });
        return true;
      case 11: e.logical = Logical::Unknown; break;
      case 12: e.logical = Logical::Json; break;
      case 13: e.logical = Logical::Bson; break;
      case 14: e.logical = Logical::Uuid; break;
      case 15: e.logical = Logical::Float16; break;
      default: e.logical = Logical::Other; break;
    }
    r.skip(TType::Struct);
    return true;
  });
}

SchemaElement read_schema_element(CompactReader& r) {
  SchemaElement e;
  read_struct(r, [&](const Field& f) {
    switch (f.id) {
      case 1: e.type = static_cast<PhysicalType>(read_i32(r, f, "SchemaElement.type")); return true;
      case 2: e.type_length = read_i32(r, f, "SchemaElement.type_length"); return true;
      case 3: e.repetition = static_cast<Repetition>(read_i32(r, f, "SchemaElement.repetition_type")); return true;
      case 4: e.name = read_string(r, f, "SchemaElement.name"); return true;
      case 5: e.num_children = read_i32(r, f, "SchemaElement.num_children"); return true;
      case 6: e.converted_type = read_i32(r, f, "SchemaElement.converted_type"); return true;
      case 7: e.scale = read_i32(r, f, "SchemaElement.scale"); return true;
      case 8: e.precision = read_i32(r, f, "SchemaElement.precision"); return true;
      case 10: expect(r, f, TType::Struct, "SchemaElement.logicalType"); read_logical_type(r, e); return true;
      default: return false;
    }
  });
  if (e.type && (static_cast<int32_t>(*e.type) < 0 || static_cast<int32_t>(*e.type) > 7))
    r.error("schema element '" + e.name + "' has physical type " + std::to_string(static_cast<int32_t>(*e.type)));
  if (e.repetition && (static_cast<int32_t>(*e.repetition) < 0 || static_cast<int32_t>(*e.repetition) > 2))
    r.error("schema element '" + e.name + "' has repetition type " + std::to_string(static_cast<int32_t>(*e.repetition)));
  return e;
}

ColumnMetaData read_column_metadata(CompactReader& r) {
  ColumnMetaData m;
  read_struct(r, [&](const Field& f) {
    switch (f.id) {
      case 1: m.type = static_cast<PhysicalType>(read_i32(r, f, "ColumnMetaData.type")); return true;
      case 3: read_list(r, f, TType::Binary, "ColumnMetaData.path_in_schema", [&] { m.path_in_schema.emplace_back(r.binary()); }); return true;
      case 4: m.codec = static_cast<Codec>(read_i32(r, f, "ColumnMetaData.codec")); return true;
      case 5: m.num_values = read_i64(r, f, "ColumnMetaData.num_values"); return true;
      case 6: m.total_uncompressed_size = read_i64(r, f, "ColumnMetaData.total_uncompressed_size"); return true;
      case 7: m.total_compressed_size = read_i64(r, f, "ColumnMetaData.total_compressed_size"); return true;
      case 9: m.data_page_offset = read_i64(r, f, "ColumnMetaData.data_page_offset"); return true;
      case 11: m.dictionary_page_offset = read_i64(r, f, "ColumnMetaData.dictionary_page_offset"); return true;
      default: return false;
    }
  });
  return m;
}

ColumnChunk read_column_chunk(CompactReader& r) {
  ColumnChunk c;
  read_struct(r, [&](const Field& f) {
    switch (f.id) {
      case 1: c.file_path = read_string(r, f, "ColumnChunk.file_path"); return true;
      case 3: expect(r, f, TType::Struct, "ColumnChunk.meta_data"); c.meta = read_column_metadata(r); return true;
      case 8: c.encrypted = true; return false;  // crypto_metadata
      default: return false;
    }
  });
  return c;
}

RowGroup read_row_group(CompactReader& r) {
  RowGroup g;
  read_struct(r, [&](const Field& f) {
    switch (f.id) {
      case 1: read_list(r, f, TType::Struct, "RowGroup.columns", [&] { g.columns.push_back(read_column_chunk(r)); }); return true;
      case 2: g.total_byte_size = read_i64(r, f, "RowGroup.total_byte_size"); return true;
      case 3: g.num_rows = read_i64(r, f, "RowGroup.num_rows"); return true;
      default: return false;
    }
  });
  return g;
}

}  // namespace

FileMetaData read_file_metadata(CompactReader& r) {
  FileMetaData m;
  read_struct(r, [&](const Field& f) {
    switch (f.id) {
      case 1: m.version = read_i32(r, f, "FileMetaData.version"); return true;
      case 2: read_list(r, f, TType::Struct, "FileMetaData.schema", [&] { m.schema.push_back(read_schema_element(r)); }); return true;
      case 3: m.num_rows = read_i64(r, f, "FileMetaData.num_rows"); return true;
      case 4: read_list(r, f, TType::Struct, "FileMetaData.row_groups", [&] { m.row_groups.push_back(read_row_group(r)); }); return true;
      case 6: m.created_by = read_string(r, f, "FileMetaData.created_by"); return true;
      case 8: m.encrypted = true; return false;  // encryption_algorithm
      default: return false;
    }
  });
  return m;
}

PageHeader read_page_header(CompactReader& r) {
  PageHeader h;
  read_struct(r, [&](const Field& f) {
    switch (f.id) {
      case 1: h.type = static_cast<PageType>(read_i32(r, f, "PageHeader.type")); return true;
      case 2: h.uncompressed_page_size = read_i32(r, f, "PageHeader.uncompressed_page_size"); return true;
      case 3: h.compressed_page_size = read_i32(r, f, "PageHeader.compressed_page_size"); return true;
      case 5:
        expect(r, f, TType::Struct, "PageHeader.data_page_header");
        h.data.emplace();
        read_struct(r, [&](const Field& g) {
          switch (g.id) {
            case 1: h.data->num_values = read_i32(r, g, "DataPageHeader.num_values"); return true;
            case 2: h.data->encoding = static_cast<Encoding>(read_i32(r, g, "DataPageHeader.encoding")); return true;
            case 3: h.data->definition_level_encoding = static_cast<Encoding>(read_i32(r, g, "DataPageHeader.definition_level_encoding")); return true;
            case 4: h.data->repetition_level_encoding = static_cast<Encoding>(read_i32(r, g, "DataPageHeader.repetition_level_encoding")); return true;
            default: return false;
          }
        });
        return true;
      case 7:
        expect(r, f, TType::Struct, "PageHeader.dictionary_page_header");
        h.dictionary.emplace();
        read_struct(r, [&](const Field& g) {
          if (g.id == 1) return h.dictionary->num_values = read_i32(r, g, "DictionaryPageHeader.num_values"), true;
          if (g.id == 2) return h.dictionary->encoding = static_cast<Encoding>(read_i32(r, g, "DictionaryPageHeader.encoding")), true;
          return false;
        });
        return true;
      case 8:
        expect(r, f, TType::Struct, "PageHeader.data_page_header_v2");
        h.data_v2.emplace();
        read_struct(r, [&](const Field& g) {
          DataPageHeaderV2& v = *h.data_v2;
          switch (g.id) {
            case 1: v.num_values = read_i32(r, g, "DataPageHeaderV2.num_values"); return true;
            case 2: v.num_nulls = read_i32(r, g, "DataPageHeaderV2.num_nulls"); return true;
            case 3: v.num_rows = read_i32(r, g, "DataPageHeaderV2.num_rows"); return true;
            case 4: v.encoding = static_cast<Encoding>(read_i32(r, g, "DataPageHeaderV2.encoding")); return true;
            case 5: v.definition_levels_byte_length = read_i32(r, g, "DataPageHeaderV2.definition_levels_byte_length"); return true;
            case 6: v.repetition_levels_byte_length = read_i32(r, g, "DataPageHeaderV2.repetition_levels_byte_length"); return true;
            case 7: expect(r, g, TType::True, "DataPageHeaderV2.is_compressed"); v.is_compressed = g.bool_value; return true;
            default: return false;
          }
        });
        return true;
      default: return false;
    }
  });
  return h;
}

const char* codec_name(Codec c) {
  switch (c) {
    case Codec::Uncompressed: return "UNCOMPRESSED";
    case Codec::Snappy: return "SNAPPY";
    case Codec::Gzip: return "GZIP";
    case Codec::Lzo: return "LZO";
    case Codec::Brotli: return "BROTLI";
    case Codec::Lz4: return "LZ4";
    case Codec::Zstd: return "ZSTD";
    case Codec::Lz4Raw: return "LZ4_RAW";
  }
  return "an unknown codec";
}

const char* encoding_name(Encoding e) {
  switch (e) {
    case Encoding::Plain: return "PLAIN";
    case Encoding::PlainDictionary: return "PLAIN_DICTIONARY";
    case Encoding::Rle: return "RLE";
    case Encoding::BitPacked: return "BIT_PACKED";
    case Encoding::DeltaBinaryPacked: return "DELTA_BINARY_PACKED";
    case Encoding::DeltaLengthByteArray: return "DELTA_LENGTH_BYTE_ARRAY";
    case Encoding::DeltaByteArray: return "DELTA_BYTE_ARRAY";
    case Encoding::RleDictionary: return "RLE_DICTIONARY";
    case Encoding::ByteStreamSplit: return "BYTE_STREAM_SPLIT";
  }
  return "an unknown encoding";
}

const char* physical_type_name(PhysicalType t) {
  switch (t) {
    case PhysicalType::Boolean: return "BOOLEAN";
    case PhysicalType::Int32: return "INT32";
    case PhysicalType::Int64: return "INT64";
    case PhysicalType::Int96: return "INT96";
    case PhysicalType::Float: return "FLOAT";
    case PhysicalType::Double: return "DOUBLE";
    case PhysicalType::ByteArray: return "BYTE_ARRAY";
    case PhysicalType::FixedLenByteArray: return "FIXED_LEN_BYTE_ARRAY";
  }
  return "an unknown type";
}

}  // namespace trl::parquet

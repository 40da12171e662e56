// Parquet's footer and page headers, decoded from Thrift (the fields trl.cpp uses; the rest are skipped).
// Field ids and enum values are those of parquet-format's parquet.thrift (docs/PARQUET.md lists them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/parquet/thrift.h"

namespace trl::parquet {

enum class PhysicalType : int32_t { Boolean = 0, Int32 = 1, Int64 = 2, Int96 = 3, Float = 4, Double = 5, ByteArray = 6, FixedLenByteArray = 7 };
enum class Repetition : int32_t { Required = 0, Optional = 1, Repeated = 2 };
// ConvertedType (the legacy annotation) values that change how a value reads.
enum ConvertedType : int32_t {
  kUtf8 = 0, kMap = 1, kMapKeyValue = 2, kList = 3, kEnum = 4, kDecimal = 5, kDate = 6, kUint8 = 11, kUint16 = 12, kUint32 = 13,
  kUint64 = 14, kJson = 19, kBson = 20
};
enum class Codec : int32_t { Uncompressed = 0, Snappy = 1, Gzip = 2, Lzo = 3, Brotli = 4, Lz4 = 5, Zstd = 6, Lz4Raw = 7 };
enum class Encoding : int32_t {
  Plain = 0, PlainDictionary = 2, Rle = 3, BitPacked = 4, DeltaBinaryPacked = 5, DeltaLengthByteArray = 6, DeltaByteArray = 7,
  RleDictionary = 8, ByteStreamSplit = 9
};
enum class PageType : int32_t { Data = 0, Index = 1, Dictionary = 2, DataV2 = 3 };

// LogicalType is a union; these are the members that matter for reading values.
enum class Logical { None, String, Map, List, Enum, Decimal, Date, Time, Timestamp, Integer, Unknown, Json, Bson, Uuid, Float16, Other };

struct SchemaElement {
  std::optional<PhysicalType> type;  // absent for groups
  int32_t type_length = 0;
  std::optional<Repetition> repetition;  // absent for the root
  std::string name;
  int32_t num_children = 0;
  std::optional<int32_t> converted_type;
  int32_t scale = 0, precision = 0;
  Logical logical = Logical::None;
  int32_t int_bit_width = 0;  // Logical::Integer
  bool int_signed = true;
};

struct ColumnMetaData {
  PhysicalType type = PhysicalType::Boolean;
  std::vector<std::string> path_in_schema;
  Codec codec = Codec::Uncompressed;
  int64_t num_values = 0;
  int64_t total_uncompressed_size = 0;
  int64_t total_compressed_size = 0;
  int64_t data_page_offset = 0;
  std::optional<int64_t> dictionary_page_offset;
};

struct ColumnChunk {
  std::string file_path;  // set when the chunk lives in another file (not supported; an error names it)
  std::optional<ColumnMetaData> meta;
  bool encrypted = false;
};

struct RowGroup {
  std::vector<ColumnChunk> columns;
  int64_t total_byte_size = 0;
  int64_t num_rows = 0;
};

struct FileMetaData {
  int32_t version = 0;
  std::vector<SchemaElement> schema;
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
  std::string created_by;
  bool encrypted = false;
};

struct DataPageHeader {
  int32_t num_values = 0;
  Encoding encoding = Encoding::Plain;
  Encoding definition_level_encoding = Encoding::Rle;
  Encoding repetition_level_encoding = Encoding::Rle;
};
struct DataPageHeaderV2 {
  int32_t num_values = 0, num_nulls = 0, num_rows = 0;
  Encoding encoding = Encoding::Plain;
  int32_t definition_levels_byte_length = 0, repetition_levels_byte_length = 0;
  bool is_compressed = true;
};
struct DictionaryPageHeader {
  int32_t num_values = 0;
  Encoding encoding = Encoding::Plain;
};

struct PageHeader {
  PageType type = PageType::Data;
  int32_t uncompressed_page_size = 0;
  int32_t compressed_page_size = 0;
  std::optional<DataPageHeader> data;
  std::optional<DataPageHeaderV2> data_v2;
  std::optional<DictionaryPageHeader> dictionary;
};

// Decoders; a malformed structure throws ThriftError (the caller names the file).
FileMetaData read_file_metadata(CompactReader& r);
PageHeader read_page_header(CompactReader& r);

const char* codec_name(Codec c);
const char* encoding_name(Encoding e);
const char* physical_type_name(PhysicalType t);

}  // namespace trl::parquet

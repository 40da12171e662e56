// Parquet's value and level encodings (docs/PARQUET.md): PLAIN, the RLE / bit-packed hybrid (levels, dictionary
// indices, booleans), dictionaries, DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY and
// BYTE_STREAM_SPLIT. Each decoder reads a bounded byte span and throws DecodeError (what and at which value) when the
// bytes run out or a value is out of range; the column reader adds the file, column and row group.
#pragma once

#include <cstdint>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "data/parquet/metadata.h"

namespace trl::parquet {

struct DecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// throw DecodeError with a fmt-style message.
template <typename... Args>
[[noreturn]] void decode_error(fmt::format_string<Args...> f, Args&&... args) {
  throw DecodeError(fmt::format(f, std::forward<Args>(args)...));
}

struct Bytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  Bytes sub(size_t offset, size_t n) const;  // checked
};

// Decoded values of one physical type. Byte strings are views into a page or dictionary buffer, or into `owned`
// (DELTA_BYTE_ARRAY rebuilds them from prefixes), so the buffers must outlive the views.
struct Values {
  PhysicalType type = PhysicalType::Int32;
  std::vector<int64_t> ints;             // BOOLEAN (0/1), INT32, INT64
  std::vector<double> floats;            // FLOAT, DOUBLE
  std::vector<std::string_view> bytes;   // BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY, INT96
  std::vector<std::string> owned;
  size_t size() const;
  void clear();
};

// Decodes `count` values of the RLE / bit-packed hybrid with `bit_width` bits from `in` (no length prefix) into
// out[0..count). Values past the runs' end are an error; a run longer than needed is cut.
void decode_rle_hybrid(Bytes in, int bit_width, size_t count, uint32_t* out);

// Bits needed for values up to max_value (0 for 0).
int bit_width_of(uint32_t max_value);

// PLAIN-encoded values of `type` (`type_length` for FIXED_LEN_BYTE_ARRAY) appended to out.
void decode_plain(Bytes in, PhysicalType type, int32_t type_length, size_t count, Values& out);

// `count` values in `encoding` (anything but the dictionary encodings) appended to out. DELTA_BYTE_ARRAY rebuilds its
// values from prefixes (a few bytes can stand for long strings): more than `max_bytes` of them is an error.
void decode_values(Bytes in, Encoding encoding, PhysicalType type, int32_t type_length, size_t count, Values& out,
                   size_t max_bytes = SIZE_MAX);

// out gets dict[indices[i]] for each index (checked against the dictionary's size).
void gather_dictionary(const Values& dict, const uint32_t* indices, size_t count, Values& out);

}  // namespace trl::parquet

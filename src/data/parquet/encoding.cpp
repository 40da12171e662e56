#include "data/parquet/encoding.h"

#include <cstring>

#include <fmt/format.h>

namespace trl::parquet {

namespace {

template <typename... Args>
[[noreturn]] void bad(fmt::format_string<Args...> f, Args&&... args) {
  throw DecodeError(fmt::format(f, std::forward<Args>(args)...));
}

// A cursor over a byte span: varints and fixed-width little-endian loads, each checked.
struct Cursor {
  Bytes in;
  size_t pos = 0;
  size_t left() const { return in.size - pos; }
  void need(size_t n, const char* what) const {
    if (n > left()) bad("{} needs {} bytes at byte {}, {} left", what, n, pos, left());
  }
  uint8_t byte(const char* what) {
    need(1, what);
    return in.data[pos++];
  }
  uint64_t uvarint(const char* what) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte(what);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    bad("{}: a varint longer than 10 bytes at byte {}", what, pos);
  }
  int64_t zigzag(const char* what) {
    const uint64_t v = uvarint(what);
    return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1));
  }
  const uint8_t* take(size_t n, const char* what) {
    need(n, what);
    const uint8_t* p = in.data + pos;
    pos += n;
    return p;
  }
};

// The `w`-bit value (w <= 64) at bit `bit` of p[0..size), LSB first; bits past the end read as 0 (callers check that
// the run's bytes are all present first).
inline uint64_t bits_at(const uint8_t* p, size_t size, size_t bit, int w) {
  const size_t byte = bit >> 3;
  const int shift = static_cast<int>(bit & 7);
  uint64_t lo = 0;
  if (byte + 8 <= size) std::memcpy(&lo, p + byte, 8);
  else
    for (size_t i = byte; i < size; ++i) lo |= static_cast<uint64_t>(p[i]) << (8 * (i - byte));
  uint64_t v = lo >> shift;
  if (shift + w > 64) {  // w > 56: one more byte
    const uint64_t hi = byte + 8 < size ? p[byte + 8] : 0;
    v |= hi << (64 - shift);
  }
  return w == 64 ? v : v & ((uint64_t{1} << w) - 1);
}

// Unpacks n values of w bits from p (LSB first) into out.
template <typename T>
void unpack_bits(const uint8_t* p, size_t size, int w, size_t n, T* out) {
  if (w == 0) {
    for (size_t i = 0; i < n; ++i) out[i] = 0;
    return;
  }
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(bits_at(p, size, i * static_cast<size_t>(w), w));
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// DELTA_BINARY_PACKED: appends `count` values (the header's total must cover them) and returns the bytes consumed.
size_t decode_delta_binary(Bytes in, bool is_int32, size_t count, std::vector<int64_t>& out) {
  Cursor c{in};
  const uint64_t block = c.uvarint("DELTA_BINARY_PACKED block size");
  const uint64_t minis = c.uvarint("DELTA_BINARY_PACKED miniblock count");
  const uint64_t total = c.uvarint("DELTA_BINARY_PACKED value count");
  int64_t value = c.zigzag("DELTA_BINARY_PACKED first value");
  if (block == 0 || minis == 0 || block % minis != 0 || (block / minis) % 8 != 0 || block > (1u << 20))
    bad("DELTA_BINARY_PACKED: block size {} with {} miniblocks", block, minis);
  if (total != count) bad("DELTA_BINARY_PACKED holds {} values, the page needs {}", total, count);
  const size_t per_mini = static_cast<size_t>(block / minis);
  out.reserve(out.size() + count);
  size_t produced = 0;
  auto emit = [&](int64_t v) {
    if (produced < count) out.push_back(is_int32 ? static_cast<int32_t>(v) : v);
    ++produced;
  };
  if (total > 0) emit(value);
  std::vector<uint64_t> tmp(per_mini);
  uint64_t left = total > 0 ? total - 1 : 0;
  while (left > 0) {
    const int64_t min_delta = c.zigzag("DELTA_BINARY_PACKED min delta");
    const uint8_t* widths = c.take(static_cast<size_t>(minis), "DELTA_BINARY_PACKED bit widths");
    for (uint64_t m = 0; m < minis && left > 0; ++m) {
      const int w = widths[m];
      if (w > 64) bad("DELTA_BINARY_PACKED: a miniblock of bit width {}", w);
      const size_t nbytes = per_mini * static_cast<size_t>(w) / 8;
      const uint8_t* p = c.take(nbytes, "DELTA_BINARY_PACKED miniblock");
      unpack_bits(p, nbytes, w, per_mini, tmp.data());
      const size_t use = static_cast<size_t>(std::min<uint64_t>(left, per_mini));
      for (size_t i = 0; i < use; ++i) {
        value = static_cast<int64_t>(static_cast<uint64_t>(value) + static_cast<uint64_t>(min_delta) + tmp[i]);
        emit(value);
      }
      left -= use;
    }
  }
  return c.pos;
}

void decode_delta_length(Bytes in, size_t count, Values& out) {
  std::vector<int64_t> lengths;
  const size_t used = decode_delta_binary(in, true, count, lengths);
  Cursor c{in, used};
  out.bytes.reserve(out.bytes.size() + count);
  for (size_t i = 0; i < count; ++i) {
    if (lengths[i] < 0) bad("DELTA_LENGTH_BYTE_ARRAY: value {} has length {}", i, lengths[i]);
    const uint8_t* p = c.take(static_cast<size_t>(lengths[i]), "DELTA_LENGTH_BYTE_ARRAY value");
    out.bytes.emplace_back(reinterpret_cast<const char*>(p), static_cast<size_t>(lengths[i]));
  }
}

void decode_delta_byte_array(Bytes in, size_t count, size_t max_bytes, Values& out) {
  std::vector<int64_t> prefixes;
  const size_t used = decode_delta_binary(in, true, count, prefixes);
  Values suffixes;
  decode_delta_length(in.sub(used, in.size - used), count, suffixes);
  // `owned` must not reallocate once views into it exist (short strings live inside the vector): room first.
  if (!out.owned.empty()) bad("DELTA_BYTE_ARRAY: a second run of values into one buffer");
  out.owned.reserve(count);
  std::string_view prev;
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    if (prefixes[i] < 0 || static_cast<size_t>(prefixes[i]) > prev.size())
      bad("DELTA_BYTE_ARRAY: value {} keeps {} bytes of a {}-byte previous value", i, prefixes[i], prev.size());
    total += static_cast<size_t>(prefixes[i]) + suffixes.bytes[i].size();
    if (total > max_bytes) bad("DELTA_BYTE_ARRAY: the values grow past {} bytes (ReadLimits::max_bytes_per_row_group)", max_bytes);
    std::string v(prev.substr(0, static_cast<size_t>(prefixes[i])));
    v += suffixes.bytes[i];
    out.owned.push_back(std::move(v));
    prev = out.owned.back();
    out.bytes.push_back(prev);
  }
}

void decode_byte_stream_split(Bytes in, PhysicalType type, int32_t type_length, size_t count, Values& out) {
  size_t width = 0;
  switch (type) {
    case PhysicalType::Float:
    case PhysicalType::Int32: width = 4; break;
    case PhysicalType::Double:
    case PhysicalType::Int64: width = 8; break;
    default: bad("BYTE_STREAM_SPLIT for {} values is not supported", physical_type_name(type));
  }
  (void)type_length;
  if (in.size % width != 0) bad("BYTE_STREAM_SPLIT: {} bytes is not a multiple of {}", in.size, width);
  const size_t n = in.size / width;
  if (count > n) bad("BYTE_STREAM_SPLIT holds {} values, the page needs {}", n, count);
  for (size_t i = 0; i < count; ++i) {
    uint8_t b[8];
    for (size_t k = 0; k < width; ++k) b[k] = in.data[k * n + i];
    if (type == PhysicalType::Float) {
      float f;
      std::memcpy(&f, b, 4);
      out.floats.push_back(f);
    } else if (type == PhysicalType::Double) {
      double d;
      std::memcpy(&d, b, 8);
      out.floats.push_back(d);
    } else if (type == PhysicalType::Int32) {
      int32_t v;
      std::memcpy(&v, b, 4);
      out.ints.push_back(v);
    } else {
      int64_t v;
      std::memcpy(&v, b, 8);
      out.ints.push_back(v);
    }
  }
}

}  // namespace

Bytes Bytes::sub(size_t offset, size_t n) const {
  if (offset > size || n > size - offset) bad("a section of {} bytes at byte {} runs past the {} bytes there are", n, offset, size);
  return Bytes{data + offset, n};
}

size_t Values::size() const {
  switch (type) {
    case PhysicalType::Boolean:
    case PhysicalType::Int32:
    case PhysicalType::Int64: return ints.size();
    case PhysicalType::Float:
    case PhysicalType::Double: return floats.size();
    default: return bytes.size();
  }
}

void Values::clear() {
  ints.clear();
  floats.clear();
  bytes.clear();
  owned.clear();
}

int bit_width_of(uint32_t max_value) {
  int w = 0;
  while (max_value >> w) ++w;
  return w;
}

void decode_rle_hybrid(Bytes in, int bit_width, size_t count, uint32_t* out) {
  if (bit_width < 0 || bit_width > 32) bad("RLE: bit width {}", bit_width);
  Cursor c{in};
  size_t n = 0;
  const size_t run_bytes = static_cast<size_t>((bit_width + 7) / 8);
  while (n < count) {
    const uint64_t header = c.uvarint("an RLE run header");
    if (header & 1) {  // bit-packed: (header >> 1) groups of 8 values
      const uint64_t groups = header >> 1;
      if (groups == 0 || groups > (in.size + 1)) bad("RLE: a bit-packed run of {} groups at byte {}", groups, c.pos);
      const size_t values = static_cast<size_t>(groups * 8);
      const size_t nbytes = static_cast<size_t>(groups) * static_cast<size_t>(bit_width);
      // The last run of a page may be cut short of its declared groups: take the bytes there are.
      const size_t avail = std::min(nbytes, c.left());
      const size_t have = bit_width == 0 ? values : std::min(values, avail * 8 / static_cast<size_t>(bit_width));
      const size_t take = std::min(have, count - n);
      if (take == 0) bad("RLE: a bit-packed run at byte {} has no bytes", c.pos);
      unpack_bits(in.data + c.pos, avail, bit_width, take, out + n);
      c.pos += avail;
      n += take;
    } else {  // a repeated value
      const uint64_t run = header >> 1;
      if (run == 0) bad("RLE: an empty run at byte {}", c.pos);
      const uint8_t* p = c.take(run_bytes, "an RLE run value");
      uint32_t v = 0;
      for (size_t i = 0; i < run_bytes; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
      if (bit_width < 32 && (v >> bit_width) != 0) bad("RLE: run value {} does not fit {} bits", v, bit_width);
      const size_t take = static_cast<size_t>(std::min<uint64_t>(run, count - n));
      std::fill(out + n, out + n + take, v);
      n += take;
    }
  }
}

void decode_plain(Bytes in, PhysicalType type, int32_t type_length, size_t count, Values& out) {
  Cursor c{in};
  switch (type) {
    case PhysicalType::Boolean: {
      if (count > in.size * 8) bad("PLAIN: {} booleans in {} bytes", count, in.size);
      out.ints.reserve(out.ints.size() + count);
      for (size_t i = 0; i < count; ++i) out.ints.push_back((in.data[i >> 3] >> (i & 7)) & 1);
      return;
    }
    case PhysicalType::Int32: {
      const uint8_t* p = c.take(count * 4, "PLAIN INT32 values");
      out.ints.reserve(out.ints.size() + count);
      for (size_t i = 0; i < count; ++i) out.ints.push_back(static_cast<int32_t>(load_u32(p + 4 * i)));
      return;
    }
    case PhysicalType::Int64: {
      const uint8_t* p = c.take(count * 8, "PLAIN INT64 values");
      const size_t base = out.ints.size();
      out.ints.resize(base + count);
      if (count) std::memcpy(out.ints.data() + base, p, count * 8);
      return;
    }
    case PhysicalType::Float: {
      const uint8_t* p = c.take(count * 4, "PLAIN FLOAT values");
      out.floats.reserve(out.floats.size() + count);
      for (size_t i = 0; i < count; ++i) {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        out.floats.push_back(f);
      }
      return;
    }
    case PhysicalType::Double: {
      const uint8_t* p = c.take(count * 8, "PLAIN DOUBLE values");
      const size_t base = out.floats.size();
      out.floats.resize(base + count);
      if (count) std::memcpy(out.floats.data() + base, p, count * 8);
      return;
    }
    case PhysicalType::Int96:
    case PhysicalType::FixedLenByteArray: {
      const size_t w = type == PhysicalType::Int96 ? 12 : static_cast<size_t>(type_length);
      if (w == 0 || type_length < 0) bad("PLAIN: FIXED_LEN_BYTE_ARRAY of length {}", type_length);
      if (count > in.size / w) bad("PLAIN: {} values of {} bytes in {} bytes", count, w, in.size);
      out.bytes.reserve(out.bytes.size() + count);
      for (size_t i = 0; i < count; ++i) out.bytes.emplace_back(reinterpret_cast<const char*>(in.data + i * w), w);
      return;
    }
    case PhysicalType::ByteArray: {
      if (count > in.size / 4) bad("PLAIN: {} byte arrays in {} bytes", count, in.size);
      out.bytes.reserve(out.bytes.size() + count);
      for (size_t i = 0; i < count; ++i) {
        const uint32_t len = load_u32(c.take(4, "a PLAIN BYTE_ARRAY length"));
        const uint8_t* p = c.take(len, "a PLAIN BYTE_ARRAY value");
        out.bytes.emplace_back(reinterpret_cast<const char*>(p), len);
      }
      return;
    }
  }
  bad("PLAIN: physical type {}", static_cast<int>(type));
}

void decode_values(Bytes in, Encoding encoding, PhysicalType type, int32_t type_length, size_t count, Values& out, size_t max_bytes) {
  switch (encoding) {
    case Encoding::Plain: return decode_plain(in, type, type_length, count, out);
    case Encoding::Rle: {
      if (type != PhysicalType::Boolean) bad("RLE values of type {} (only BOOLEAN values are RLE-encoded)", physical_type_name(type));
      Cursor c{in};
      const uint32_t len = load_u32(c.take(4, "the RLE length prefix"));
      std::vector<uint32_t> bits(count);
      decode_rle_hybrid(in.sub(4, len), 1, count, bits.data());
      out.ints.insert(out.ints.end(), bits.begin(), bits.end());
      return;
    }
    case Encoding::DeltaBinaryPacked:
      if (type != PhysicalType::Int32 && type != PhysicalType::Int64) bad("DELTA_BINARY_PACKED for {} values", physical_type_name(type));
      decode_delta_binary(in, type == PhysicalType::Int32, count, out.ints);
      return;
    case Encoding::DeltaLengthByteArray:
      if (type != PhysicalType::ByteArray) bad("DELTA_LENGTH_BYTE_ARRAY for {} values", physical_type_name(type));
      return decode_delta_length(in, count, out);
    case Encoding::DeltaByteArray:
      if (type != PhysicalType::ByteArray && type != PhysicalType::FixedLenByteArray) bad("DELTA_BYTE_ARRAY for {} values", physical_type_name(type));
      return decode_delta_byte_array(in, count, max_bytes, out);
    case Encoding::ByteStreamSplit: return decode_byte_stream_split(in, type, type_length, count, out);
    default: break;
  }
  bad("values encoded as {} are not supported", encoding_name(encoding));
}

void gather_dictionary(const Values& dict, const uint32_t* idx, size_t count, Values& out) {
  const size_t n = dict.size();
  for (size_t i = 0; i < count; ++i)
    if (idx[i] >= n) bad("dictionary index {} of a {}-entry dictionary (value {})", idx[i], n, i);
  switch (dict.type) {
    case PhysicalType::Boolean:
    case PhysicalType::Int32:
    case PhysicalType::Int64:
      out.ints.reserve(out.ints.size() + count);
      for (size_t i = 0; i < count; ++i) out.ints.push_back(dict.ints[idx[i]]);
      return;
    case PhysicalType::Float:
    case PhysicalType::Double:
      out.floats.reserve(out.floats.size() + count);
      for (size_t i = 0; i < count; ++i) out.floats.push_back(dict.floats[idx[i]]);
      return;
    default:
      out.bytes.reserve(out.bytes.size() + count);
      for (size_t i = 0; i < count; ++i) out.bytes.push_back(dict.bytes[idx[i]]);
      return;
  }
}

}  // namespace trl::parquet

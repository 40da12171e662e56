// A reader of Thrift's compact protocol, the encoding of Parquet's footer and page headers (docs/PARQUET.md).
//
// Every read is bounded by the buffer: a length, a list size or a varint that runs past the end is a ThriftError,
// never a read out of bounds, and a size is checked against the bytes left before anything is allocated for it.
// Fields are read one at a time (next_field), so a struct decoder handles the ids it knows and skips the rest
// (skip), as Thrift's own readers do: files written by newer writers carry fields this reader has never heard of.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace trl::parquet {

// What went wrong, with the byte offset; the caller adds the file and the structure it was reading.
struct ThriftError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Compact protocol type codes (the low nibble of a field header; the element type of a list).
enum class TType : uint8_t { Stop = 0, True = 1, False = 2, Byte = 3, I16 = 4, I32 = 5, I64 = 6, Double = 7, Binary = 8, List = 9, Set = 10, Map = 11, Struct = 12 };

class CompactReader {
 public:
  CompactReader(const uint8_t* data, size_t size) : p_(data), begin_(data), end_(data + size) {}

  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

  // A struct's fields: `next_field` returns false at the Stop byte. Nested structs keep their own last-field id.
  struct Field {
    int16_t id = 0;
    TType type = TType::Stop;
    bool bool_value = false;  // booleans live in the field header
  };
  void begin_struct() {
    enter();
    last_id_stack_[depth_] = 0;
  }
  void end_struct() { --depth_; }
  bool next_field(Field& f) {
    const uint8_t h = byte();
    const auto type = static_cast<TType>(h & 0x0F);
    if (type == TType::Stop) return false;
    const uint8_t delta = h >> 4;
    int16_t& last = last_id_stack_[depth_];
    f.id = delta ? static_cast<int16_t>(last + delta) : static_cast<int16_t>(zigzag32(varint()));
    last = f.id;
    f.type = type;
    if (static_cast<uint8_t>(type) > static_cast<uint8_t>(TType::Struct)) error("unknown field type " + std::to_string(h & 0x0F));
    f.bool_value = type == TType::True;
    return true;
  }

  int8_t i8() { return static_cast<int8_t>(byte()); }
  int32_t i32() { return zigzag32(varint()); }
  int64_t i64() { return zigzag64(varint()); }
  double f64() {
    need(8);
    double v;
    std::memcpy(&v, p_, 8);
    p_ += 8;
    return v;
  }
  std::string_view binary() {
    const uint64_t n = varint();
    need(n);
    std::string_view s(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
    p_ += n;
    return s;
  }
  // A list header: its size (checked against the bytes left: every element takes at least one byte, except booleans
  // in a field, which never occur in lists) and element type.
  uint32_t list(TType& elem) {
    const uint8_t h = byte();
    elem = static_cast<TType>(h & 0x0F);
    uint64_t n = h >> 4;
    if (n == 15) n = varint();
    if (n > remaining()) error("a list of " + std::to_string(n) + " elements in " + std::to_string(remaining()) + " bytes");
    if (n > elements_left_) error("more than " + std::to_string(kMaxElements) + " list elements in all");
    elements_left_ -= n;
    return static_cast<uint32_t>(n);
  }

  // Skips a value of `type` (whole structs, lists and maps included).
  void skip(TType type) {
    switch (type) {
      case TType::True:
      case TType::False: return;  // in a field header; a list's booleans are handled below
      case TType::Byte: byte(); return;
      case TType::I16:
      case TType::I32:
      case TType::I64: varint(); return;
      case TType::Double: need(8); p_ += 8; return;
      case TType::Binary: binary(); return;
      case TType::List:
      case TType::Set: {
        TType elem;
        const uint32_t n = list(elem);
        enter();
        for (uint32_t i = 0; i < n; ++i) skip_element(elem);
        --depth_;
        return;
      }
      case TType::Map: {
        const uint64_t n = varint();
        if (n == 0) return;
        if (n > remaining()) error("a map of " + std::to_string(n) + " entries in " + std::to_string(remaining()) + " bytes");
        const uint8_t kv = byte();
        enter();
        for (uint64_t i = 0; i < n; ++i) {
          skip_element(static_cast<TType>(kv >> 4));
          skip_element(static_cast<TType>(kv & 0x0F));
        }
        --depth_;
        return;
      }
      case TType::Struct: {
        begin_struct();
        Field f;
        while (next_field(f)) skip(f.type);
        end_struct();
        return;
      }
      case TType::Stop: break;
    }
    error("cannot skip a value of type " + std::to_string(static_cast<int>(type)));
  }

  [[noreturn]] void error(const std::string& what) const { throw ThriftError("Thrift compact data at byte " + std::to_string(offset()) + ": " + what); }

 private:
  static constexpr int kMaxDepth = 64;
  // List elements of one decode in all: each becomes a struct of up to ~150 bytes, so a footer of 1-byte elements
  // would otherwise ask for 150 times its size (real footers hold thousands to hundreds of thousands).
  static constexpr uint64_t kMaxElements = uint64_t{1} << 22;

  void enter() {  // a struct, list, set or map one level deeper (the stack of skip() and the struct decoders)
    if (++depth_ > kMaxDepth) error("values nested deeper than 64 levels");
    last_id_stack_[depth_] = 0;
  }

  void need(uint64_t n) const {
    if (n > remaining()) error("needs " + std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left");
  }
  uint8_t byte() {
    need(1);
    return *p_++;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    error("a varint longer than 10 bytes");
  }
  void skip_element(TType t) {
    if (t == TType::True || t == TType::False) byte();  // list booleans are one byte each
    else skip(t);
  }
  static int32_t zigzag32(uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v >> 1) ^ (~static_cast<uint32_t>(v & 1) + 1)); }
  static int64_t zigzag64(uint64_t v) { return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1)); }

  const uint8_t* p_;
  const uint8_t* begin_;
  const uint8_t* end_;
  int depth_ = 0;
  int16_t last_id_stack_[kMaxDepth + 2] = {};
  uint64_t elements_left_ = kMaxElements;
};

}  // namespace trl::parquet

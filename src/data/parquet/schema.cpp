#include "data/parquet/schema.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <simdjson.h>

namespace trl::parquet {

namespace {

using ojson = nlohmann::ordered_json;

template <typename... Args>
[[noreturn]] void bad(fmt::format_string<Args...> f, Args&&... args) {
  throw DecodeError(fmt::format(f, std::forward<Args>(args)...));
}

constexpr int kMaxNesting = 64;

// The flat element list as a tree (children by index), checked: every count fits the list.
struct Flat {
  const SchemaElement* e = nullptr;
  std::vector<Flat> children;
};

Flat unflatten(const std::vector<SchemaElement>& els, size_t& next, int depth) {
  if (depth > kMaxNesting) bad("the schema nests deeper than {} levels", kMaxNesting);
  if (next >= els.size()) bad("the schema ends inside a group (element {} of {})", next, els.size());
  Flat f{&els[next++], {}};
  const int32_t n = f.e->num_children;
  if (f.e->type && n > 0) bad("schema element '{}' is a {} leaf with {} children", f.e->name, physical_type_name(*f.e->type), n);
  if (!f.e->type && n <= 0 && depth > 0) bad("schema element '{}' is a group without children", f.e->name);
  if (n < 0 || static_cast<size_t>(n) > els.size() - next) bad("schema element '{}' declares {} children, {} elements follow", f.e->name, n, els.size() - next);
  f.children.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) f.children.push_back(unflatten(els, next, depth + 1));
  return f;
}

bool is_list_annotated(const SchemaElement& e) { return e.logical == Logical::List || (e.converted_type && *e.converted_type == kList); }
bool is_map_annotated(const SchemaElement& e) {
  return e.logical == Logical::Map || (e.converted_type && (*e.converted_type == kMap || *e.converted_type == kMapKeyValue));
}
bool repeated(const SchemaElement& e) { return e.repetition && *e.repetition == Repetition::Repeated; }
bool optional(const SchemaElement& e) { return e.repetition && *e.repetition == Repetition::Optional; }

struct Builder {
  Schema& out;
  int next_leaf = 0;

  // `pd` / `pr`: the definition and repetition levels of the parent. `as_element`: the node is the repeated node of
  // a list whose levels the caller already counted.
  Node build(const Flat& f, int pd, int pr, bool as_element) {
    const SchemaElement& e = *f.e;
    if (repeated(e) && !as_element) {  // a bare repeated field: a list that is never null
      Node list;
      list.kind = Node::Kind::List;
      list.name = e.name;
      list.def = pd;
      list.nonempty_def = pd + 1;
      list.elem_rep = pr + 1;
      list.children.push_back(build(f, pd + 1, pr + 1, true));
      return list;
    }
    const int def = as_element ? pd : pd + (optional(e) ? 1 : 0);
    Node n;
    n.name = e.name;
    n.def = def;
    if (e.type) {
      n.kind = Node::Kind::Leaf;
      n.leaf = next_leaf++;
      return n;
    }
    if (is_list_annotated(e) && !as_element) return build_list(f, def, pr);
    if (is_map_annotated(e) && !as_element && f.children.size() == 1 && repeated(*f.children[0].e)) return build_map(f, def, pr);
    n.kind = Node::Kind::Struct;
    for (const Flat& c : f.children) n.children.push_back(build(c, def, pr, false));
    return n;
  }

  // A LIST-annotated group: one repeated child, in one of the forms of parquet-format's LogicalTypes.md.
  Node build_list(const Flat& f, int def, int pr) {
    const SchemaElement& e = *f.e;
    if (f.children.size() != 1 || !repeated(*f.children[0].e)) bad("LIST group '{}' must have one repeated child", e.name);
    const Flat& r = f.children[0];
    Node list;
    list.kind = Node::Kind::List;
    list.name = e.name;
    list.def = def;
    list.nonempty_def = def + 1;
    list.elem_rep = pr + 1;
    const bool three_level = !r.e->type && r.children.size() == 1 && r.e->name != "array" && r.e->name != e.name + "_tuple";
    if (three_level) list.children.push_back(build(r.children[0], def + 1, pr + 1, false));
    else list.children.push_back(build(r, def + 1, pr + 1, true));  // two-level: the repeated node is the element
    return list;
  }

  Node build_map(const Flat& f, int def, int pr) {
    const Flat& kv = f.children[0];
    if (kv.e->type || kv.children.size() != 2) bad("MAP group '{}' must hold a repeated group of key and value", f.e->name);
    Node map;
    map.kind = Node::Kind::Map;
    map.name = f.e->name;
    map.def = def;
    map.nonempty_def = def + 1;
    map.elem_rep = pr + 1;
    Node entry;  // each element: {key, value}
    entry.kind = Node::Kind::Struct;
    entry.name = kv.e->name;
    entry.def = def + 1;
    entry.children.push_back(build(kv.children[0], def + 1, pr + 1, false));
    entry.children.push_back(build(kv.children[1], def + 1, pr + 1, false));
    map.children.push_back(std::move(entry));
    return map;
  }
};

void collect_leaves(const Node& n, std::vector<const Node*>& chain, std::vector<std::string>& names, Schema& s,
                    const std::vector<const SchemaElement*>& leaf_elements, int rep) {
  chain.push_back(&n);
  if (n.kind == Node::Kind::Leaf) {
    Leaf& l = s.leaves[static_cast<size_t>(n.leaf)];
    l.element = leaf_elements[static_cast<size_t>(n.leaf)];
    l.max_def = n.def;
    l.max_rep = rep;
    l.chain = chain;
  } else {
    for (const Node& c : n.children) collect_leaves(c, chain, names, s, leaf_elements, n.kind == Node::Kind::List || n.kind == Node::Kind::Map ? n.elem_rep : rep);
  }
  chain.pop_back();
}

void leaf_elements_in_order(const Flat& f, std::vector<const SchemaElement*>& out, std::vector<std::string>& path,
                            std::vector<std::string>& paths) {
  if (f.e->type) {
    out.push_back(f.e);
    std::string p;
    for (const auto& s : path) p += (p.empty() ? "" : ".") + s;
    paths.push_back(p + (p.empty() ? "" : ".") + f.e->name);
    return;
  }
  path.push_back(f.e->name);
  for (const Flat& c : f.children) leaf_elements_in_order(c, out, path, paths);
  path.pop_back();
}

std::string leaf_type(const SchemaElement& e) {
  switch (e.logical) {
    case Logical::String:
    case Logical::Enum:
    case Logical::Json: return "string";
    case Logical::Decimal: return fmt::format("decimal({}, {})", e.precision, e.scale);
    case Logical::Date: return "date32";
    case Logical::Timestamp: return "timestamp";
    case Logical::Time: return "time";
    case Logical::Uuid: return "uuid";
    case Logical::Float16: return "float16";
    case Logical::Integer: return fmt::format("{}int{}", e.int_signed ? "" : "u", e.int_bit_width);
    default: break;
  }
  if (e.converted_type) {
    switch (*e.converted_type) {
      case kUtf8:
      case kEnum:
      case kJson: return "string";
      case kDecimal: return fmt::format("decimal({}, {})", e.precision, e.scale);
      case kDate: return "date32";
      case kUint8: return "uint8";
      case kUint16: return "uint16";
      case kUint32: return "uint32";
      case kUint64: return "uint64";
      default: break;
    }
  }
  switch (*e.type) {
    case PhysicalType::Boolean: return "bool";
    case PhysicalType::Int32: return "int32";
    case PhysicalType::Int64: return "int64";
    case PhysicalType::Int96: return "timestamp[int96]";
    case PhysicalType::Float: return "float";
    case PhysicalType::Double: return "double";
    case PhysicalType::ByteArray: return "binary";
    case PhysicalType::FixedLenByteArray: return fmt::format("fixed_size_binary[{}]", e.type_length);
  }
  return "unknown";
}

bool is_unsigned(const SchemaElement& e) {
  if (e.logical == Logical::Integer) return !e.int_signed;
  return e.converted_type && *e.converted_type >= kUint8 && *e.converted_type <= kUint64;
}
bool is_decimal(const SchemaElement& e) { return e.logical == Logical::Decimal || (e.converted_type && *e.converted_type == kDecimal); }

// A big-endian two's-complement integer (decimals in byte arrays) as a double.
double big_endian_signed(std::string_view b) {
  if (b.empty()) return 0;
  double v = static_cast<int8_t>(b[0]);
  for (size_t i = 1; i < b.size(); ++i) v = v * 256 + static_cast<uint8_t>(b[i]);
  return v;
}

bool is_text(const SchemaElement& e) {
  if (e.logical == Logical::String || e.logical == Logical::Enum || e.logical == Logical::Json) return true;
  return e.converted_type && (*e.converted_type == kUtf8 || *e.converted_type == kEnum || *e.converted_type == kJson);
}

// Whether s is well-formed UTF-8: simdjson's validator (SIMD, several GB/s; the reader's text is mostly this check
// and a copy).
bool valid_utf8(std::string_view s) { return simdjson::validate_utf8(s.data(), s.size()); }

double half_to_double(uint16_t h) {
  const int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? std::nan("") : sign * INFINITY;
  return sign * std::ldexp(mant + 1024, exp - 25);
}

}  // namespace

void build_schema(const std::vector<SchemaElement>& elements, Schema& out) {
  if (elements.empty()) bad("the schema is empty");
  size_t next = 0;
  const Flat root = unflatten(elements, next, 0);
  if (next != elements.size()) bad("the schema's root holds {} of its {} elements", next, elements.size());
  if (root.e->type) bad("the schema's root '{}' is a leaf", root.e->name);
  Builder b{out};
  out.root.kind = Node::Kind::Struct;
  out.root.name = root.e->name;
  for (const Flat& c : root.children) out.root.children.push_back(b.build(c, 0, 0, false));

  std::vector<const SchemaElement*> leaf_elements;
  std::vector<std::string> path, paths;
  for (const Flat& c : root.children) leaf_elements_in_order(c, leaf_elements, path, paths);
  if (static_cast<int>(leaf_elements.size()) != b.next_leaf) bad("the schema's leaves could not be matched to columns");
  out.leaves.resize(leaf_elements.size());
  std::vector<const Node*> chain;
  std::vector<std::string> names;
  collect_leaves(out.root, chain, names, out, leaf_elements, 0);
  for (size_t i = 0; i < out.leaves.size(); ++i) out.leaves[i].path = paths[i];
}

std::string type_string(const Node& n, const std::vector<Leaf>& leaves) {
  switch (n.kind) {
    case Node::Kind::Leaf: return leaf_type(*leaves[static_cast<size_t>(n.leaf)].element);
    case Node::Kind::List: return "list<" + type_string(n.children[0], leaves) + ">";
    case Node::Kind::Map:
      return "map<" + type_string(n.children[0].children[0], leaves) + ", " + type_string(n.children[0].children[1], leaves) + ">";
    case Node::Kind::Struct: {
      std::string s = "struct<";
      for (size_t i = 0; i < n.children.size(); ++i) s += (i ? ", " : "") + n.children[i].name + ": " + type_string(n.children[i], leaves);
      return s + ">";
    }
  }
  return "unknown";
}

ojson leaf_value(const SchemaElement& e, const Values& v, size_t i) {
  switch (*e.type) {
    case PhysicalType::Boolean: return ojson(v.ints[i] != 0);
    case PhysicalType::Int32:
      if (is_decimal(e)) return ojson(static_cast<double>(v.ints[i]) * std::pow(10.0, -e.scale));
      if (is_unsigned(e)) return ojson(static_cast<uint64_t>(static_cast<uint32_t>(v.ints[i])));
      return ojson(v.ints[i]);
    case PhysicalType::Int64:
      if (is_decimal(e)) return ojson(static_cast<double>(v.ints[i]) * std::pow(10.0, -e.scale));
      if (is_unsigned(e)) return ojson(static_cast<uint64_t>(v.ints[i]));
      return ojson(v.ints[i]);
    case PhysicalType::Float:
    case PhysicalType::Double: return ojson(v.floats[i]);
    case PhysicalType::Int96: {  // nanoseconds of the day, then the Julian day: nanoseconds since the Unix epoch
      const std::string_view b = v.bytes[i];
      int64_t nanos, out;
      uint32_t day;
      std::memcpy(&nanos, b.data(), 8);
      std::memcpy(&day, b.data() + 8, 4);
      if (__builtin_mul_overflow(static_cast<int64_t>(day) - 2440588, int64_t{86400} * 1000000000, &out) || __builtin_add_overflow(out, nanos, &out))
        decode_error("an INT96 timestamp (Julian day {}) past the range of nanoseconds since 1970 in 64 bits", day);
      return ojson(out);
    }
    case PhysicalType::ByteArray:
    case PhysicalType::FixedLenByteArray: {
      const std::string_view b = v.bytes[i];
      if (is_decimal(e)) return ojson(big_endian_signed(b) * std::pow(10.0, -e.scale));
      if (e.logical == Logical::Float16 && b.size() == 2) return ojson(half_to_double(static_cast<uint16_t>(static_cast<uint8_t>(b[0]) | static_cast<uint8_t>(b[1]) << 8)));
      if (valid_utf8(b)) return ojson(std::string(b));
      // Text that is not UTF-8 is corrupt; other bytes (images, audio) stay bytes: a JSON binary value.
      if (is_text(e)) decode_error("a string value (value {} of the page) that is not valid UTF-8", i);
      return ojson::binary(std::vector<uint8_t>(b.begin(), b.end()));
    }
  }
  return ojson();
}

}  // namespace trl::parquet

// jinja::Value: Python-like values (None, bool, int, float, str, list, dict, callables) with Python's str(),
// repr(), equality and json.dumps formatting.
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "tokenizer/jinja.h"
#include "tokenizer/unicode.h"

namespace trl::jinja {

const char* Value::kind_name(Type t) {
  switch (t) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::List: return "list";
    case Type::Dict: return "dict";
    case Type::Function: return "function";
  }
  return "?";
}

void Value::wrong_kind(Type expected) const {
  throw TemplateError(std::string("expected a ") + kind_name(expected) + ", got " + kind_name(type_));
}

Value Value::none() {
  Value v;
  v.type_ = Type::None;
  return v;
}
Value::Value(bool b) : type_(Type::Bool), b_(b) {}
Value::Value(int v) : type_(Type::Int), i_(v) {}
Value::Value(int64_t v) : type_(Type::Int), i_(v) {}
Value::Value(double v) : type_(Type::Float), f_(v) {}
Value::Value(const char* s) : type_(Type::String), s_(std::make_shared<std::string>(s)) {}
Value::Value(std::string s) : type_(Type::String), s_(std::make_shared<std::string>(std::move(s))) {}
Value::Value(List l) : type_(Type::List), l_(std::make_shared<List>(std::move(l))) {}
Value::Value(Dict d, bool is_namespace) : type_(Type::Dict), namespace_(is_namespace), d_(std::make_shared<Dict>(std::move(d))) {}
Value::Value(Function f) : type_(Type::Function), fn_(std::make_shared<Function>(std::move(f))) {}

namespace {
template <typename J>
Value value_from_json(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(value_from_json(e));
      return Value(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), value_from_json(it.value()));
      return Value(std::move(d));
    }
    default: return Value();
  }
}
}  // namespace

Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }

bool Value::truthy() const {
  switch (type_) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return b_;
    case Type::Int: return i_ != 0;
    case Type::Float: return f_ != 0.0;
    case Type::String: return !s_->empty();
    case Type::List: return !l_->empty();
    case Type::Dict: return namespace_ || !d_->empty();
    case Type::Function: return true;
  }
  return false;
}

const Value* Value::get(const std::string& key) const {
  if (type_ != Type::Dict) return nullptr;
  for (const auto& [k, v] : *d_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

// Python's repr() of a float: the shortest digits that round-trip, fixed notation when the decimal exponent is
// in [-4, 16), otherwise d.ddde+XX.
std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  std::string s = fmt::format("{}", x);  // shortest round-trip representation
  std::string sign;
  if (s[0] == '-') sign = "-", s = s.substr(1);
  // Extract digits and decpt (value = 0.DIGITS x 10^decpt).
  std::string digits;
  int decpt = 0;
  const size_t e = s.find('e');
  std::string mant = e == std::string::npos ? s : s.substr(0, e);
  const int exp10 = e == std::string::npos ? 0 : std::stoi(s.substr(e + 1));
  const size_t dot = mant.find('.');
  const std::string ip = dot == std::string::npos ? mant : mant.substr(0, dot);
  const std::string fp = dot == std::string::npos ? "" : mant.substr(dot + 1);
  digits = ip + fp;
  decpt = static_cast<int>(ip.size()) + exp10;
  size_t lead = 0;
  while (lead + 1 < digits.size() && digits[lead] == '0') ++lead, --decpt;
  digits = digits.substr(lead);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    const int ex = decpt - 1;
    out += fmt::format("e{}{:02d}", ex < 0 ? '-' : '+', std::abs(ex));
  }
  return sign + out;
}

std::string py_repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\\') out += "\\\\", ++i;
    else if (c == static_cast<unsigned char>(q)) out += '\\', out += static_cast<char>(q), ++i;
    else if (c == '\n') out += "\\n", ++i;
    else if (c == '\r') out += "\\r", ++i;
    else if (c == '\t') out += "\\t", ++i;
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c), ++i;
    else {
      const size_t n = unicode::utf8_length(c);
      out.append(s, i, n);
      i += n;
    }
  }
  out += q;
  return out;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, int indent, int depth, bool sort_keys, const std::string& item_sep, const std::string& key_sep) {
  auto newline = [&](int d) {
    if (indent >= 0) {
      out += '\n';
      out.append(static_cast<size_t>(indent * d), ' ');
    }
  };
  switch (v.type()) {
    case Value::Type::Undefined: throw TemplateError("tojson: cannot serialise an undefined value");
    case Value::Type::None: out += "null"; break;
    case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Value::Type::Int: out += std::to_string(v.as_int()); break;
    case Value::Type::Float: {
      const double x = v.as_number();
      if (std::isnan(x)) out += "NaN";
      else if (std::isinf(x)) out += x < 0 ? "-Infinity" : "Infinity";
      else out += py_float(x);
      break;
    }
    case Value::Type::String: json_string(out, v.as_string()); break;
    case Value::Type::List: {
      if (v.as_list().empty()) {
        out += "[]";
        break;
      }
      out += '[';
      bool first = true;
      for (const Value& e : v.as_list()) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        json_dump(out, e, indent, depth + 1, sort_keys, item_sep, key_sep);
      }
      newline(depth);
      out += ']';
      break;
    }
    case Value::Type::Dict: {
      if (v.as_dict().empty()) {
        out += "{}";
        break;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_dict()) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        json_string(out, kv->first);
        out += key_sep;
        json_dump(out, kv->second, indent, depth + 1, sort_keys, item_sep, key_sep);
      }
      newline(depth);
      out += '}';
      break;
    }
    case Value::Type::Function: throw TemplateError("tojson: cannot serialise a function");
  }
}

}  // namespace

std::string Value::str() const {
  switch (type_) {
    case Type::Undefined: return "";
    case Type::None: return "None";
    case Type::Bool: return b_ ? "True" : "False";
    case Type::Int: return std::to_string(i_);
    case Type::Float: return py_float(f_);
    case Type::String: return *s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (type_) {
    case Type::String: return py_repr_string(*s_);
    case Type::List: {
      std::string out = "[";
      for (size_t i = 0; i < l_->size(); ++i) out += (i ? ", " : "") + (*l_)[i].repr();
      return out + "]";
    }
    case Type::Dict: {
      if (namespace_) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < d_->size(); ++i) out += (i ? ", " : "") + py_repr_string((*d_)[i].first) + ": " + (*d_)[i].second.repr();
      return out + "}";
    }
    case Type::Function: return "<function>";
    case Type::Undefined: return "Undefined";
    default: return str();
  }
}

std::string Value::to_json(int indent, bool sort_keys, const std::string* item_sep, const std::string* key_sep) const {
  std::string out;
  const std::string is = item_sep ? *item_sep : (indent >= 0 ? "," : ", ");
  const std::string ks = key_sep ? *key_sep : ": ";
  json_dump(out, *this, indent, 0, sort_keys, is, ks);
  return out;
}

bool operator==(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (a.type() == T::Int && b.type() == T::Int) return a.as_int() == b.as_int();
    return a.as_number() == b.as_number();
  }
  if ((a.type() == T::Bool && b.is_number()) || (b.type() == T::Bool && a.is_number())) {
    const double x = a.type() == T::Bool ? (a.as_bool() ? 1 : 0) : a.as_number();
    const double y = b.type() == T::Bool ? (b.as_bool() ? 1 : 0) : b.as_number();
    return x == y;
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case T::Undefined:
    case T::None: return true;
    case T::Bool: return a.as_bool() == b.as_bool();
    case T::String: return a.as_string() == b.as_string();
    case T::List: {
      if (a.as_list().size() != b.as_list().size()) return false;
      for (size_t i = 0; i < a.as_list().size(); ++i)
        if (!(a.as_list()[i] == b.as_list()[i])) return false;
      return true;
    }
    case T::Dict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [k, v] : a.as_dict()) {
        const Value* o = b.get(k);
        if (!o || !(*o == v)) return false;
      }
      return true;
    }
    default: return false;
  }
}

Value Args::get(size_t i, const std::string& name, Value def) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return v;
  if (i < positional.size()) return positional[i];
  return def;
}

}  // namespace trl::jinja

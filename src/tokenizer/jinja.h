// A Jinja2 interpreter for chat templates, written for trl.cpp. It renders real tokenizer_config.json templates
// verbatim, in the environment Transformers uses: trim_blocks and lstrip_blocks on, the loopcontrols extension
// (break/continue), {% generation %} blocks (their output spans are recorded for assistant masks), an immutable
// sandbox (lists and dicts cannot be mutated; namespace() attributes can), `tojson` as Python's json.dumps with
// ensure_ascii=False, and raise_exception()/strftime_now() globals.
//
// Supported: output, if/elif/else, for (unpacking, loop.*, else, inline `if` filter, recursive not), set (also
// block set and namespace attributes), macro and call of macros, filter blocks, break/continue, raw, comments,
// whitespace control (-/+), expressions with Jinja's precedence (or, and, not, comparisons, in, is-tests, + -, ~,
// * / // %, **, unary -, filters, attribute/subscript/slice, calls), list/dict/tuple literals, Python string/dict
// methods. Errors are TemplateError with the template line and column.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/core/error.h"

namespace trl::jinja {

class TemplateError : public Error {
 public:
  using Error::Error;
};

class Value;
using List = std::vector<Value>;
// Ordered like a Python dict (insertion order).
using Dict = std::vector<std::pair<std::string, Value>>;
struct Args;
using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Type { Undefined, None, Bool, Int, Float, String, List, Dict, Function };
  static const char* kind_name(Type t);  // Python's name of the kind: "NoneType", "int", "str", ...

  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int v);
  Value(int64_t v);
  Value(double v);
  Value(const char* s);
  Value(std::string s);
  Value(List l);
  Value(Dict d, bool is_namespace = false);
  Value(Function f);
  // From JSON; use ordered_json to keep the key order of the input, as Python dicts do (tojson relies on it).
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::Undefined; }
  bool is_none() const { return type_ == Type::None; }
  bool is_string() const { return type_ == Type::String; }
  bool is_number() const { return type_ == Type::Int || type_ == Type::Float; }
  bool is_list() const { return type_ == Type::List; }
  bool is_dict() const { return type_ == Type::Dict; }
  bool is_namespace() const { return type_ == Type::Dict && namespace_; }
  bool truthy() const;

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return type_ == Type::Int ? static_cast<double>(i_) : f_; }
  // The held value; another kind is a TemplateError ("expected a str, got int"), never a read through a null pointer
  // (a template may hand any value to any method or filter: found by fuzzing).
  const std::string& as_string() const { return check(Type::String), *s_; }
  const List& as_list() const { return check(Type::List), *l_; }
  const Dict& as_dict() const { return check(Type::Dict), *d_; }
  Dict& mutable_dict() { return check(Type::Dict), *d_; }  // namespace attributes only
  const Function& as_function() const { return check(Type::Function), *fn_; }

  // dict lookup; nullptr when absent
  const Value* get(const std::string& key) const;

  // Python's str() of the value ("None", "True", "1.0", "['a', 1]", ...); undefined is "".
  std::string str() const;
  // Python's repr().
  std::string repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=...); indent < 0 means None.
  std::string to_json(int indent = -1, bool sort_keys = false, const std::string* item_sep = nullptr, const std::string* key_sep = nullptr) const;

 private:
  Type type_ = Type::Undefined;
  bool namespace_ = false;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  void check(Type expected) const {
    if (type_ != expected) wrong_kind(expected);
  }
  [[noreturn]] void wrong_kind(Type expected) const;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<List> l_;
  std::shared_ptr<Dict> d_;
  std::shared_ptr<Function> fn_;
};

bool operator==(const Value& a, const Value& b);

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The i-th positional or the keyword `name`, or `def`.
  Value get(size_t i, const std::string& name, Value def = Value()) const;
};

struct RenderResult {
  std::string text;
  // [begin, end) byte offsets into `text` of the output of each {% generation %} block.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

struct Node;

class Template {
 public:
  // Parses `source`; a syntax error throws TemplateError naming `name`, the line and the column.
  explicit Template(const std::string& source, std::string name = "template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  // Renders with `context` (a dict of variables). Runtime errors throw TemplateError with line and column.
  RenderResult render(const Value& context) const;

 private:
  std::string name_;
  std::shared_ptr<Node> root_;
};

}  // namespace trl::jinja

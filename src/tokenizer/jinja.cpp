// The Jinja2 lexer, parser and interpreter (see jinja.h for what is supported).
#include "tokenizer/jinja.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <charconv>
#include <ctime>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "tokenizer/unicode.h"

namespace trl::jinja {

// =============================================================================================================
// Lexer: template text -> tokens, with Jinja's whitespace control (trim_blocks, lstrip_blocks, -/+ modifiers).

namespace {

// Limits on what a template may make (the bad-input sweep exhausted memory with range(10**12), "x" * 10**11 and
// center(10**12), and overflowed the stack with a macro calling itself): a template that needs more is an error.
constexpr int64_t kMaxItems = int64_t{1} << 24;  // items of a list, bytes of a string made by one operation
constexpr int kMaxCallDepth = 256;                // calls nested in calls
constexpr int kMaxNesting = 100;                   // expressions and blocks nested in the source (the parser recurses)

// A decimal integer of int64's range, or nothing (out of range: the template's number is refused, not stoll's
// exception).
std::optional<int64_t> parse_int64(std::string_view text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace

namespace {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Int, Float, String, Op, End };

struct Token {
  Tok kind;
  std::string text;
  int line = 1, col = 1;
};

bool is_py_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string rstrip_ws(const std::string& s) {
  size_t e = s.size();
  while (e > 0 && is_py_space(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(0, e);
}

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : src_(src), name_(name) {}

  std::vector<Token> run() {
    // keep_trailing_newline=False: a single trailing newline of the template is dropped.
    if (!src_.empty() && src_.back() == '\n') {
      src_.pop_back();
      if (!src_.empty() && src_.back() == '\r') src_.pop_back();
    }
    bool line_starting = true;
    bool strip_next_ws = false;  // a previous tag ended with '-'
    while (pos_ < src_.size()) {
      size_t open = find_tag_open(pos_);
      std::string text = src_.substr(pos_, open - pos_);
      if (strip_next_ws) {
        size_t k = 0;
        while (k < text.size() && is_py_space(static_cast<unsigned char>(text[k]))) ++k;
        text = text.substr(k);
        strip_next_ws = false;
      }
      const int text_line = line_, text_col = col_;
      advance_to(open);
      if (open >= src_.size()) {
        if (!text.empty()) out_.push_back({Tok::Text, text, text_line, text_col});
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      char sign = 0;
      if (open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+')) sign = src_[open + 2];
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces/tabs between the start of the line and a block or comment tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (nl != std::string::npos || line_starting) {
          bool only_ws = true;
          for (size_t k = l_pos; k < text.size(); ++k) only_ws = only_ws && is_py_space(static_cast<unsigned char>(text[k]));
          if (only_ws) text = text.substr(0, l_pos);
        }
      }
      if (!text.empty()) out_.push_back({Tok::Text, text, text_line, text_col});
      const int tag_line = line_, tag_col = col_;
      advance_to(open + 2 + (sign ? 1 : 0));
      bool trailing_newline_consumed = false;
      if (kind == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string::npos) error(tag_line, tag_col, "unclosed comment: missing '#}'");
        const bool minus = close > pos_ && src_[close - 1] == '-';
        advance_to(close + 2);
        if (minus) strip_next_ws = true;
        else trailing_newline_consumed = trim_newline();
      } else if (kind == '%' && raw_block_ahead()) {
        trailing_newline_consumed = lex_raw(tag_line, tag_col);
      } else {
        out_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", tag_line, tag_col});
        const char* close = kind == '{' ? "}}" : "%}";
        bool minus = false, plus = false;
        lex_expression(close, minus, plus, tag_line, tag_col);
        out_.push_back({kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", line_, col_});
        if (minus) strip_next_ws = true;
        else if (kind == '%' && !plus) trailing_newline_consumed = trim_newline();
      }
      line_starting = trailing_newline_consumed;
    }
    out_.push_back({Tok::End, "", line_, col_});
    return out_;
  }

 private:
  [[noreturn]] void error(int line, int col, const std::string& msg) const {
    throw TemplateError(fmt::format("{}: line {}, column {}: {}", name_, line, col, msg));
  }

  size_t find_tag_open(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return src_.size();
  }

  void advance_to(size_t p) {
    for (; pos_ < p && pos_ < src_.size(); ++pos_) {
      if (src_[pos_] == '\n') ++line_, col_ = 1;
      else if ((static_cast<unsigned char>(src_[pos_]) & 0xc0) != 0x80) ++col_;
    }
  }

  // trim_blocks: one newline right after a block tag is removed.
  bool trim_newline() {
    if (pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
      return true;
    }
    return false;
  }

  bool raw_block_ahead() const {
    size_t p = pos_;
    while (p < src_.size() && is_py_space(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_py_space(static_cast<unsigned char>(src_[p]))) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  // {% raw %}...{% endraw %}: the content is text. As in Jinja, the opening tag does not trim the newline after
  // it (trim_blocks), '-' on either tag strips whitespace, and lstrip_blocks applies before {% endraw %}.
  bool lex_raw(int line, int col) {
    const size_t p = src_.find("%}", pos_);
    const bool minus_open = p > 0 && src_[p - 1] == '-';
    advance_to(p + 2);
    size_t search = pos_;
    while (true) {
      const size_t t = src_.find("{%", search);
      if (t == std::string::npos) error(line, col, "unclosed raw block: missing {% endraw %}");
      size_t q = t + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      while (q < src_.size() && is_py_space(static_cast<unsigned char>(src_[q]))) ++q;
      if (src_.compare(q, 6, "endraw") == 0) {
        std::string text = src_.substr(pos_, t - pos_);
        if (minus_open) {
          size_t k = 0;
          while (k < text.size() && is_py_space(static_cast<unsigned char>(text[k]))) ++k;
          text = text.substr(k);
        }
        if (sign == '-') {
          text = rstrip_ws(text);
        } else if (sign != '+') {
          const size_t nl = text.rfind('\n');
          if (nl != std::string::npos) {
            bool only_ws = true;
            for (size_t k = nl + 1; k < text.size(); ++k) only_ws = only_ws && is_py_space(static_cast<unsigned char>(text[k]));
            if (only_ws) text = text.substr(0, nl + 1);
          }
        }
        if (!text.empty()) out_.push_back({Tok::Text, text, line_, col_});
        const size_t close = src_.find("%}", q);
        if (close == std::string::npos) error(line, col, "unclosed endraw tag");
        const bool minus_close = src_[close - 1] == '-';
        const bool plus_close = src_[close - 1] == '+';
        advance_to(close + 2);
        if (minus_close) {
          while (pos_ < src_.size() && is_py_space(static_cast<unsigned char>(src_[pos_]))) advance_to(pos_ + 1);
          return false;
        }
        return plus_close ? false : trim_newline();
      }
      search = t + 2;
    }
  }

  void lex_expression(const char* close, bool& minus, bool& plus, int tag_line, int tag_col) {
    while (true) {
      while (pos_ < src_.size() && is_py_space(static_cast<unsigned char>(src_[pos_]))) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) error(tag_line, tag_col, fmt::format("unclosed tag: missing '{}'", close));
      if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
        minus = true;
        advance_to(pos_ + 3);
        return;
      }
      if (src_[pos_] == '+' && src_.compare(pos_ + 1, 2, close) == 0) {
        plus = true;
        advance_to(pos_ + 3);
        return;
      }
      if (src_.compare(pos_, 2, close) == 0) {
        advance_to(pos_ + 2);
        return;
      }
      const int line = line_, col = col_;
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        out_.push_back({Tok::Name, src_.substr(pos_, e - pos_), line, col});
        advance_to(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos_;
        bool is_float = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t f = e + 1;
          if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
          if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
            is_float = true;
            e = f;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string num = src_.substr(pos_, e - pos_);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        out_.push_back({is_float ? Tok::Float : Tok::Int, num, line, col});
        advance_to(e);
      } else if (c == '\'' || c == '"') {
        out_.push_back({Tok::String, lex_string(c, line, col), line, col});
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                                    "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        bool found = false;
        for (const char* op : ops) {
          const size_t n = std::strlen(op);
          if (src_.compare(pos_, n, op) == 0) {
            out_.push_back({Tok::Op, op, line, col});
            advance_to(pos_ + n);
            found = true;
            break;
          }
        }
        if (!found) error(line, col, fmt::format("unexpected character '{}'", c));
      }
    }
  }

  std::string lex_string(char quote, int line, int col) {
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) error(line, col, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c == '\\' && p + 1 < src_.size()) {
        const char n = src_[p + 1];
        switch (n) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case '\\': out += '\\'; break;
          case '\'': out += '\''; break;
          case '"': out += '"'; break;
          case '0': out += '\0'; break;
          case 'u':
          case 'x': {
            const size_t len = n == 'u' ? 4 : 2;
            if (p + 2 + len > src_.size()) error(line, col, "truncated escape in string literal");
            const std::string hex = src_.substr(p + 2, len);
            if (!std::all_of(hex.begin(), hex.end(), [](char h) { return std::isxdigit(static_cast<unsigned char>(h)) != 0; }))
              error(line, col, fmt::format("\\{} in a string literal needs {} hex digits, got '{}'", n, len, hex));  // found by fuzzing
            unicode::append_utf8(out, static_cast<char32_t>(std::stoul(hex, nullptr, 16)));
            p += len;
            break;
          }
          case '\n': break;
          default: out += '\\', out += n;
        }
        p += 2;
        continue;
      }
      out += c;
      ++p;
    }
    advance_to(p + 1);
    return out;
  }

  std::string src_;
  std::string name_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
  std::vector<Token> out_;
};

}  // namespace

// =============================================================================================================
// AST

using NodePtr = std::shared_ptr<Node>;

enum class K {
  // expressions
  Literal, Name, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, And, Or, Binary, Compare, Cond, ListLit, TupleLit, DictLit,
  // statements
  Text, Print, If, For, Set, SetBlock, Macro, FilterBlock, Generation, Break, Continue, CallBlock
};

}  // namespace trl::jinja

namespace trl::jinja {

struct Node {
  K kind;
  int line = 0, col = 0;
  std::string name;                 // Name/Attr/Filter/Test/Set target/Macro name/op of Binary
  std::vector<std::string> names;   // For targets, Set targets, Macro params, Compare ops
  Value value;                      // Literal / Text
  std::vector<NodePtr> kids;        // operands, args, if-conditions
  std::vector<std::pair<std::string, NodePtr>> kwargs;
  std::vector<std::vector<NodePtr>> bodies;  // If: one per branch (+ else); For: body, else; others: body
  bool flag = false;                // Test: negated; Set: namespace attribute; For: has condition
};

namespace {

// =============================================================================================================
// Parser

class Parser {
 public:
  Parser(std::vector<Token> toks, std::string name) : t_(std::move(toks)), name_(std::move(name)) {}

  std::vector<NodePtr> parse_template() {
    auto body = parse_body({});
    if (cur().kind != Tok::End) error(cur(), "unexpected tag");
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  [[noreturn]] void error(const Token& at, const std::string& msg) const {
    throw TemplateError(fmt::format("{}: line {}, column {}: {}", name_, at.line, at.col, msg));
  }
  // One level of the parser's recursion (a nested expression, a unary operator, a block): refused past kMaxNesting,
  // where a template of brackets or blocks without end would otherwise exhaust the stack.
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.error(p.cur(), fmt::format("expressions or blocks nested deeper than {}", kMaxNesting));
    }
    ~Nest() { --p.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;
  };
  bool is_op(const char* op) const { return cur().kind == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == Tok::Name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cur(), fmt::format("expected '{}', got '{}'", op, describe(cur())));
    ++i_;
  }
  std::string expect_name() {
    if (cur().kind != Tok::Name) error(cur(), fmt::format("expected a name, got '{}'", describe(cur())));
    return t_[i_++].text;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::VarEnd: return "}}";
      case Tok::BlockEnd: return "%}";
      case Tok::End: return "end of template";
      case Tok::Text: return "text";
      default: return t.text;
    }
  }
  NodePtr make(K k, const Token& at) {
    auto n = std::make_shared<Node>();
    n->kind = k;
    n->line = at.line;
    n->col = at.col;
    return n;
  }
  void expect_block_end() {
    if (cur().kind != Tok::BlockEnd) error(cur(), fmt::format("expected '%}}', got '{}'", describe(cur())));
    ++i_;
  }

  // Parses statements until a block tag whose keyword is in `stops` (left unconsumed, positioned at its name).
  std::vector<NodePtr> parse_body(const std::vector<std::string>& stops) {
    const Nest nest(*this);
    std::vector<NodePtr> body;
    while (true) {
      const Token& t = cur();
      if (t.kind == Tok::End) {
        if (!stops.empty()) error(t, fmt::format("unexpected end of template: missing {{% {} %}}", stops.back()));
        return body;
      }
      if (t.kind == Tok::Text) {
        auto n = make(K::Text, t);
        n->value = Value(t.text);
        body.push_back(n);
        ++i_;
      } else if (t.kind == Tok::VarBegin) {
        ++i_;
        auto n = make(K::Print, t);
        n->kids.push_back(parse_expression());
        if (cur().kind != Tok::VarEnd) error(cur(), fmt::format("expected '}}}}', got '{}'", describe(cur())));
        ++i_;
        body.push_back(n);
      } else if (t.kind == Tok::BlockBegin) {
        const Token& kw = peek();
        if (kw.kind != Tok::Name) error(kw, "expected a statement keyword after '{%'");
        if (std::find(stops.begin(), stops.end(), kw.text) != stops.end()) {
          ++i_;  // at the keyword
          return body;
        }
        ++i_;
        body.push_back(parse_statement());
      } else {
        error(t, "unexpected token");
      }
    }
  }

  NodePtr parse_statement() {
    const Token kw = cur();
    const std::string& k = kw.text;
    if (k == "if") return parse_if();
    if (k == "for") return parse_for();
    if (k == "set") return parse_set();
    if (k == "macro") return parse_macro();
    if (k == "call") return parse_call_block();
    if (k == "filter") return parse_filter_block();
    if (k == "generation") {
      ++i_;
      expect_block_end();
      auto n = make(K::Generation, kw);
      n->bodies.push_back(parse_body({"endgeneration"}));
      ++i_;
      expect_block_end();
      return n;
    }
    if (k == "break" || k == "continue") {
      ++i_;
      expect_block_end();
      return make(k == "break" ? K::Break : K::Continue, kw);
    }
    error(kw, fmt::format("unknown statement '{}'", k));
  }

  NodePtr parse_if() {
    auto n = make(K::If, cur());
    ++i_;
    n->kids.push_back(parse_expression());
    expect_block_end();
    while (true) {
      n->bodies.push_back(parse_body({"elif", "else", "endif"}));
      const std::string kw = cur().text;
      ++i_;
      if (kw == "elif") {
        n->kids.push_back(parse_expression());
        expect_block_end();
      } else if (kw == "else") {
        expect_block_end();
        n->bodies.push_back(parse_body({"endif"}));
        ++i_;
        expect_block_end();
        return n;
      } else {
        expect_block_end();
        return n;
      }
    }
  }

  NodePtr parse_for() {
    auto n = make(K::For, cur());
    ++i_;
    n->names.push_back(expect_name());
    while (is_op(",")) {
      ++i_;
      n->names.push_back(expect_name());
    }
    if (!is_name("in")) error(cur(), "expected 'in' in for loop");
    ++i_;
    n->kids.push_back(parse_expression(/*allow_cond=*/false));
    if (is_name("if")) {
      ++i_;
      n->flag = true;
      n->kids.push_back(parse_expression());
    }
    if (is_name("recursive")) error(cur(), "recursive for loops are not supported");
    expect_block_end();
    n->bodies.push_back(parse_body({"else", "endfor"}));
    const std::string kw = cur().text;
    ++i_;
    expect_block_end();
    if (kw == "else") {
      n->bodies.push_back(parse_body({"endfor"}));
      ++i_;
      expect_block_end();
    }
    return n;
  }

  NodePtr parse_set() {
    const Token at = cur();
    ++i_;
    std::string target = expect_name();
    if (is_op(".")) {  // namespace attribute
      ++i_;
      auto n = make(K::Set, at);
      n->flag = true;
      n->name = target;
      n->names.push_back(expect_name());
      expect_op("=");
      n->kids.push_back(parse_expression());
      expect_block_end();
      return n;
    }
    std::vector<std::string> targets{target};
    while (is_op(",")) {
      ++i_;
      targets.push_back(expect_name());
    }
    if (cur().kind == Tok::BlockEnd || is_op("|")) {  // block set: {% set x %}...{% endset %}
      auto n = make(K::SetBlock, at);
      n->name = target;
      if (is_op("|")) {
        ++i_;
        n->kids.push_back(parse_filter_chain(nullptr));
      }
      expect_block_end();
      n->bodies.push_back(parse_body({"endset"}));
      ++i_;
      expect_block_end();
      return n;
    }
    auto n = make(K::Set, at);
    n->names = targets;
    expect_op("=");
    n->kids.push_back(parse_tuple_or_expression());
    expect_block_end();
    return n;
  }

  NodePtr parse_macro() {
    auto n = make(K::Macro, cur());
    ++i_;
    n->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      n->names.push_back(expect_name());
      if (is_op("=")) {
        ++i_;
        n->kwargs.emplace_back(n->names.back(), parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++i_;
    expect_block_end();
    n->bodies.push_back(parse_body({"endmacro"}));
    ++i_;
    if (cur().kind == Tok::Name) ++i_;  // {% endmacro name %}
    expect_block_end();
    return n;
  }

  NodePtr parse_call_block() {
    auto n = make(K::CallBlock, cur());
    ++i_;
    n->kids.push_back(parse_expression());
    expect_block_end();
    n->bodies.push_back(parse_body({"endcall"}));
    ++i_;
    expect_block_end();
    return n;
  }

  NodePtr parse_filter_block() {
    auto n = make(K::FilterBlock, cur());
    ++i_;
    n->kids.push_back(parse_filter_chain(nullptr));
    expect_block_end();
    n->bodies.push_back(parse_body({"endfilter"}));
    ++i_;
    expect_block_end();
    return n;
  }

  // ---- expressions ----

  NodePtr parse_tuple_or_expression() {
    const Token at = cur();
    NodePtr first = parse_expression();
    if (!is_op(",")) return first;
    auto t = make(K::TupleLit, at);
    t->kids.push_back(first);
    while (is_op(",")) {
      ++i_;
      if (cur().kind == Tok::BlockEnd || cur().kind == Tok::VarEnd) break;
      t->kids.push_back(parse_expression());
    }
    return t;
  }

  NodePtr parse_expression(bool allow_cond = true) {
    const Nest nest(*this);
    NodePtr e = parse_or();
    if (allow_cond && is_name("if")) {
      auto n = make(K::Cond, cur());
      ++i_;
      n->kids.push_back(e);               // then
      n->kids.push_back(parse_or());      // condition
      if (is_name("else")) {
        ++i_;
        n->kids.push_back(parse_expression());
      }
      return n;
    }
    return e;
  }

  NodePtr parse_or() {
    NodePtr a = parse_and();
    while (is_name("or")) {
      auto n = make(K::Or, cur());
      ++i_;
      n->kids = {a, parse_and()};
      a = n;
    }
    return a;
  }

  NodePtr parse_and() {
    NodePtr a = parse_not();
    while (is_name("and")) {
      auto n = make(K::And, cur());
      ++i_;
      n->kids = {a, parse_not()};
      a = n;
    }
    return a;
  }

  NodePtr parse_not() {
    if (is_name("not")) {
      const Nest nest(*this);
      auto n = make(K::Not, cur());
      ++i_;
      n->kids.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  NodePtr parse_compare() {
    NodePtr a = parse_math1();
    NodePtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                                    cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().kind == Tok::Name && peek().text == "in") {
        op = "not in";
        i_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(K::Compare, cur());
        cmp->kids.push_back(a);
      }
      cmp->names.push_back(op);
      cmp->kids.push_back(parse_math1());
    }
    return cmp ? cmp : a;
  }

  NodePtr binary(const std::string& op, NodePtr a, NodePtr b, const Token& at) {
    auto n = make(K::Binary, at);
    n->name = op;
    n->kids = {std::move(a), std::move(b)};
    return n;
  }

  NodePtr parse_math1() {
    NodePtr a = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token at = cur();
      ++i_;
      a = binary(at.text, a, parse_concat(), at);
    }
    return a;
  }

  NodePtr parse_concat() {
    NodePtr a = parse_math2();
    while (is_op("~")) {
      const Token at = cur();
      ++i_;
      a = binary("~", a, parse_math2(), at);
    }
    return a;
  }

  NodePtr parse_math2() {
    NodePtr a = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token at = cur();
      ++i_;
      a = binary(at.text, a, parse_pow(), at);
    }
    return a;
  }

  NodePtr parse_pow() {
    NodePtr a = parse_unary(true);
    while (is_op("**")) {
      const Token at = cur();
      ++i_;
      a = binary("**", a, parse_unary(true), at);
    }
    return a;
  }

  NodePtr parse_unary(bool with_filter) {
    NodePtr node;
    if (is_op("-") || is_op("+")) {
      const Nest nest(*this);
      auto n = make(is_op("-") ? K::Neg : K::Pos, cur());
      ++i_;
      n->kids.push_back(parse_unary(false));
      node = n;
    } else {
      node = parse_primary();
    }
    node = parse_postfix(node);
    if (with_filter) node = parse_filter_expr(node);
    return node;
  }

  NodePtr parse_primary() {
    const Token t = cur();
    switch (t.kind) {
      case Tok::Name: {
        ++i_;
        if (t.text == "true" || t.text == "True") return literal(Value(true), t);
        if (t.text == "false" || t.text == "False") return literal(Value(false), t);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t);
        auto n = make(K::Name, t);
        n->name = t.text;
        return n;
      }
      case Tok::String: {
        std::string s;
        while (cur().kind == Tok::String) s += t_[i_++].text;  // adjacent literals concatenate
        return literal(Value(s), t);
      }
      case Tok::Int: {
        const std::optional<int64_t> v = parse_int64(t.text);
        if (!v) error(t, "integer literal " + t.text + " is beyond 64 bits");
        ++i_;
        return literal(Value(*v), t);
      }
      case Tok::Float: {
        const double v = std::strtod(t.text.c_str(), nullptr);
        if (!std::isfinite(v)) error(t, "number literal " + t.text + " is beyond a double");
        ++i_;
        return literal(Value(v), t);
      }
      case Tok::Op:
        if (t.text == "(") {
          ++i_;
          if (is_op(")")) {
            ++i_;
            return make(K::TupleLit, t);
          }
          NodePtr e = parse_expression();
          if (is_op(",")) {
            auto tup = make(K::TupleLit, t);
            tup->kids.push_back(e);
            while (is_op(",")) {
              ++i_;
              if (is_op(")")) break;
              tup->kids.push_back(parse_expression());
            }
            e = tup;
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          ++i_;
          auto n = make(K::ListLit, t);
          while (!is_op("]")) {
            n->kids.push_back(parse_expression());
            if (!is_op("]")) expect_op(",");
          }
          ++i_;
          return n;
        }
        if (t.text == "{") {
          ++i_;
          auto n = make(K::DictLit, t);
          while (!is_op("}")) {
            n->kids.push_back(parse_expression());
            expect_op(":");
            n->kids.push_back(parse_expression());
            if (!is_op("}")) expect_op(",");
          }
          ++i_;
          return n;
        }
        break;
      default: break;
    }
    error(t, fmt::format("unexpected '{}'", describe(t)));
  }

  NodePtr literal(Value v, const Token& at) {
    auto n = make(K::Literal, at);
    n->value = std::move(v);
    return n;
  }

  void parse_call_args(NodePtr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().kind == Tok::Name && peek().kind == Tok::Op && peek().text == "=") {
        std::string key = cur().text;
        i_ += 2;
        call->kwargs.emplace_back(key, parse_expression());
      } else {
        call->kids.push_back(parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++i_;
  }

  NodePtr parse_postfix(NodePtr node) {
    while (true) {
      if (is_op(".")) {
        const Token at = cur();
        ++i_;
        auto n = make(K::Attr, at);
        if (cur().kind == Tok::Int) n->name = t_[i_++].text;
        else n->name = expect_name();
        n->kids.push_back(node);
        node = n;
      } else if (is_op("[")) {
        const Token at = cur();
        ++i_;
        NodePtr parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            ++colons;
            ++i_;
            if (colons > 2) error(cur(), "too many ':' in slice");
            continue;
          }
          if (parts[colons]) error(cur(), "expected ':' or ']' in a subscript");  // m[1 2]
          parts[colons] = parse_expression();
        }
        ++i_;
        if (colons == 0) {
          if (!parts[0]) error(at, "empty subscript '[]'");  // found by fuzzing: m[] had no index node
          auto n = make(K::Item, at);
          n->kids = {node, parts[0]};
          node = n;
        } else {
          auto n = make(K::Slice, at);
          n->kids = {node, parts[0], parts[1], parts[2]};
          node = n;
        }
      } else if (is_op("(")) {
        auto n = make(K::Call, cur());
        n->kids.push_back(node);
        parse_call_args(n);
        node = n;
      } else {
        return node;
      }
    }
  }

  // `node | f(args) | g ...` and `node is [not] test(args)`
  NodePtr parse_filter_expr(NodePtr node) {
    while (true) {
      if (is_op("|")) {
        ++i_;
        node = parse_filter_chain(node);
      } else if (is_name("is")) {
        const Token at = cur();
        ++i_;
        auto n = make(K::Test, at);
        if (is_name("not")) {
          n->flag = true;
          ++i_;
        }
        // Tests named like keywords or operators.
        if (cur().kind == Tok::Name) n->name = t_[i_++].text;
        else if (cur().kind == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
                                           cur().text == "<=" || cur().text == ">="))
          n->name = t_[i_++].text;
        else error(cur(), "expected a test name after 'is'");
        n->kids.push_back(node);
        if (is_op("(")) {
          parse_call_args(n);
        } else if (cur().kind == Tok::String || cur().kind == Tok::Int || cur().kind == Tok::Float ||
                   (cur().kind == Tok::Name && cur().text != "and" && cur().text != "or" && cur().text != "else" && cur().text != "if" &&
                    cur().text != "in" && cur().text != "not" && cur().text != "is")) {
          n->kids.push_back(parse_primary());  // `x is divisibleby 3`, `x is sameas none`
        }
        node = n;
      } else {
        return node;
      }
    }
  }

  // One filter (after '|'), applied to `input` (nullptr for filter blocks / set blocks).
  NodePtr parse_filter_chain(NodePtr input) {
    auto n = make(K::Filter, cur());
    n->name = expect_name();
    while (is_op(".")) {  // dotted filter names are not Jinja, but keep the error clear
      error(cur(), "unexpected '.' in filter name");
    }
    n->kids.push_back(input);
    if (is_op("(")) parse_call_args(n);
    return n;
  }

  std::vector<Token> t_;
  std::string name_;
  size_t i_ = 0;
  int depth_ = 0;  // Nest levels open
};

}  // namespace

// =============================================================================================================
// Interpreter

namespace {

struct BreakSignal {};
struct ContinueSignal {};

class Interpreter {
 public:
  Interpreter(const std::string& name, RenderResult& out) : name_(name), out_(out) {}

  void push_scope() { scopes_.emplace_back(); }
  void pop_scope() { scopes_.pop_back(); }
  void set_var(const std::string& k, Value v) { scopes_.back()[k] = std::move(v); }

  Value lookup(const std::string& k) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(k);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  [[noreturn]] void error(const Node& n, const std::string& msg) const {
    throw TemplateError(fmt::format("{}: line {}, column {}: {}", name_, n.line, n.col, msg));
  }

  void exec(const std::vector<NodePtr>& body) {
    for (const NodePtr& n : body) exec(*n);
  }

  void exec(const Node& n) {
    switch (n.kind) {
      case K::Text: out_.text += n.value.as_string(); return;
      case K::Print: {
        const Value v = eval(*n.kids[0]);
        out_.text += v.str();
        return;
      }
      case K::If: {
        for (size_t b = 0; b < n.kids.size(); ++b) {
          if (eval(*n.kids[b]).truthy()) {
            exec(n.bodies[b]);
            return;
          }
        }
        if (n.bodies.size() > n.kids.size()) exec(n.bodies.back());
        return;
      }
      case K::For: return exec_for(n);
      case K::Set: {
        Value v = eval(*n.kids[0]);
        if (n.flag) {
          Value ns = lookup(n.name);
          if (!ns.is_namespace()) error(n, fmt::format("cannot assign attribute '{}' on '{}': it is not a namespace", n.names[0], n.name));
          Dict& d = ns.mutable_dict();
          for (auto& kv : d) {
            if (kv.first == n.names[0]) {
              kv.second = std::move(v);
              return;
            }
          }
          d.emplace_back(n.names[0], std::move(v));
          return;
        }
        assign(n, n.names, v);
        return;
      }
      case K::SetBlock: {
        std::string saved = std::move(out_.text);
        out_.text.clear();
        exec(n.bodies[0]);
        Value v(std::move(out_.text));
        out_.text = std::move(saved);
        if (!n.kids.empty()) v = apply_filter(*n.kids[0], v);
        set_var(n.name, v);
        return;
      }
      case K::Macro: {
        set_var(n.name, make_macro(n));
        return;
      }
      case K::CallBlock: error(n, "{% call %} blocks are not supported");
      case K::FilterBlock: {
        std::string saved = std::move(out_.text);
        out_.text.clear();
        exec(n.bodies[0]);
        Value v(std::move(out_.text));
        out_.text = std::move(saved);
        out_.text += apply_filter(*n.kids[0], v).str();
        return;
      }
      case K::Generation: {
        const size_t begin = out_.text.size();
        exec(n.bodies[0]);
        out_.generation_spans.emplace_back(begin, out_.text.size());
        return;
      }
      case K::Break:
        if (loop_depth_ == 0) error(n, "'break' outside a loop");
        throw BreakSignal{};
      case K::Continue:
        if (loop_depth_ == 0) error(n, "'continue' outside a loop");
        throw ContinueSignal{};
      default: error(n, "internal error: expression used as a statement");
    }
  }

  void assign(const Node& n, const std::vector<std::string>& names, const Value& v) {
    if (names.size() == 1) {
      set_var(names[0], v);
      return;
    }
    const List items = iterate(n, v);
    if (items.size() != names.size()) error(n, fmt::format("cannot unpack {} values into {} names", items.size(), names.size()));
    for (size_t i = 0; i < names.size(); ++i) set_var(names[i], items[i]);
  }

  void exec_for(const Node& n) {
    const Value seq = eval(*n.kids[0]);
    List items = iterate(*n.kids[0], seq);
    if (n.flag) {  // {% for x in xs if cond %}: filter before loop.* is computed
      List kept;
      for (const Value& item : items) {
        push_scope();
        assign(n, n.names, item);
        const bool keep = eval(*n.kids[1]).truthy();
        pop_scope();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.bodies.size() > 1) exec(n.bodies[1]);
      return;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    ++loop_depth_;
    for (int64_t i = 0; i < len; ++i) {
      push_scope();
      Dict loop = {{"index", Value(i + 1)},
                   {"index0", Value(i)},
                   {"revindex", Value(len - i)},
                   {"revindex0", Value(len - i - 1)},
                   {"first", Value(i == 0)},
                   {"last", Value(i == len - 1)},
                   {"length", Value(len)},
                   {"depth", Value(1)},
                   {"depth0", Value(0)},
                   {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value()},
                   {"nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value()}};
      loop.emplace_back("cycle", Value(Function([i](Args& a) -> Value {
                          if (a.positional.empty()) throw TemplateError("loop.cycle() needs at least one argument");
                          return a.positional[static_cast<size_t>(i) % a.positional.size()];
                        })));
      set_var("loop", Value(std::move(loop)));
      assign(n, n.names, items[static_cast<size_t>(i)]);
      bool stop = false;
      try {
        exec(n.bodies[0]);
      } catch (const BreakSignal&) {
        stop = true;
      } catch (const ContinueSignal&) {
      }
      pop_scope();
      if (stop) break;
    }
    --loop_depth_;
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    auto self = this;
    return Value(Function([node, self](Args& a) -> Value {
      self->push_scope();
      for (size_t p = 0; p < node->names.size(); ++p) {
        Value def;
        for (const auto& [k, e] : node->kwargs)
          if (k == node->names[p]) def = self->eval(*e);
        self->set_var(node->names[p], a.get(p, node->names[p], def));
      }
      std::string saved = std::move(self->out_.text);
      self->out_.text.clear();
      self->exec(node->bodies[0]);
      std::string result = std::move(self->out_.text);
      self->out_.text = std::move(saved);
      self->pop_scope();
      return Value(result);
    }));
  }

  List iterate(const Node& at, const Value& v) {
    switch (v.type()) {
      case Value::Type::List: return v.as_list();
      case Value::Type::Dict: {
        List keys;
        for (const auto& kv : v.as_dict()) keys.emplace_back(kv.first);
        return keys;
      }
      case Value::Type::String: {
        List chars;
        const std::string& s = v.as_string();
        for (size_t i = 0; i < s.size();) {
          const size_t len = unicode::utf8_length(static_cast<unsigned char>(s[i]));
          chars.emplace_back(s.substr(i, len));
          i += len;
        }
        return chars;
      }
      case Value::Type::Undefined: return {};
      default: error(at, fmt::format("'{}' is not iterable", type_name(v)));
    }
  }

  static std::string type_name(const Value& v) { return Value::kind_name(v.type()); }

  // ---- expressions ----

  Value eval(const Node& n) {
    switch (n.kind) {
      case K::Literal: return n.value;
      case K::Name: return lookup(n.name);
      case K::Attr: {
        const Value obj = eval(*n.kids[0]);
        return get_attr(n, obj, n.name);
      }
      case K::Item: {
        const Value obj = eval(*n.kids[0]);
        const Value key = eval(*n.kids[1]);
        return get_item(n, obj, key);
      }
      case K::Slice: return slice(n);
      case K::Call: return call(n);
      case K::Filter: return apply_filter(n, eval(*n.kids[0]));
      case K::Test: {
        const bool r = run_test(n);
        return Value(n.flag ? !r : r);
      }
      case K::Neg: {
        const Value v = eval(*n.kids[0]);
        if (v.type() == Value::Type::Int) return Value(-v.as_int());
        if (v.type() == Value::Type::Float) return Value(-v.as_number());
        error(n, fmt::format("bad operand type for unary -: '{}'", type_name(v)));
      }
      case K::Pos: return eval(*n.kids[0]);
      case K::Not: return Value(!eval(*n.kids[0]).truthy());
      case K::And: {
        Value a = eval(*n.kids[0]);
        return a.truthy() ? eval(*n.kids[1]) : a;
      }
      case K::Or: {
        Value a = eval(*n.kids[0]);
        return a.truthy() ? a : eval(*n.kids[1]);
      }
      case K::Binary: return binary(n, eval(*n.kids[0]), eval(*n.kids[1]));
      case K::Compare: {
        Value left = eval(*n.kids[0]);
        for (size_t k = 0; k < n.names.size(); ++k) {
          Value right = eval(*n.kids[k + 1]);
          if (!compare(n, n.names[k], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case K::Cond: {
        if (eval(*n.kids[1]).truthy()) return eval(*n.kids[0]);
        return n.kids.size() > 2 ? eval(*n.kids[2]) : Value();
      }
      case K::ListLit:
      case K::TupleLit: {
        List l;
        for (const auto& k : n.kids) l.push_back(eval(*k));
        return Value(std::move(l));
      }
      case K::DictLit: {
        Dict d;
        for (size_t k = 0; k + 1 < n.kids.size(); k += 2) {
          const Value key = eval(*n.kids[k]);
          if (!key.is_string()) error(n, "dict literal keys must be strings");
          Value val = eval(*n.kids[k + 1]);
          bool replaced = false;
          for (auto& kv : d)
            if (kv.first == key.as_string()) kv.second = val, replaced = true;
          if (!replaced) d.emplace_back(key.as_string(), std::move(val));
        }
        return Value(std::move(d));
      }
      default: error(n, "internal error: statement used as an expression");
    }
  }

  Value get_attr(const Node& n, const Value& obj, const std::string& name) {
    if (obj.is_undefined()) error(n, fmt::format("'{}' is undefined (reading attribute '{}')", describe_expr(*n.kids[0]), name));
    if (obj.is_dict()) {
      if (const Value* v = obj.get(name)) return *v;
      if (!obj.is_namespace()) {
        Value m = method(n, obj, name);
        if (!m.is_undefined()) return m;
      }
      return Value();
    }
    if (obj.is_string() || obj.is_list()) {
      Value m = method(n, obj, name);
      if (!m.is_undefined()) return m;
      if (obj.is_list() && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0]))) {
        const std::optional<int64_t> i = parse_int64(name);
        return i ? get_item(n, obj, Value(*i)) : Value();
      }
    }
    return Value();
  }

  static std::string describe_expr(const Node& n) {
    if (n.kind == K::Name) return n.name;
    if (n.kind == K::Attr) return describe_expr(*n.kids[0]) + "." + n.name;
    return "value";
  }

  Value get_item(const Node& n, const Value& obj, const Value& key) {
    if (obj.is_undefined()) error(n, fmt::format("'{}' is undefined (reading an item)", describe_expr(*n.kids[0])));
    if (obj.is_dict()) {
      if (key.is_string()) {
        if (const Value* v = obj.get(key.as_string())) return *v;
      }
      return Value();
    }
    if (obj.is_list() || obj.is_string()) {
      if (key.type() != Value::Type::Int) {
        if (key.is_string()) return get_attr(n, obj, key.as_string());
        error(n, fmt::format("indices must be integers, not {}", type_name(key)));
      }
      if (obj.is_list()) {
        const int64_t len = static_cast<int64_t>(obj.as_list().size());
        int64_t i = key.as_int();
        if (i < 0) i += len;
        if (i < 0 || i >= len) return Value();
        return obj.as_list()[static_cast<size_t>(i)];
      }
      const List chars = iterate(n, obj);
      const int64_t len = static_cast<int64_t>(chars.size());
      int64_t i = key.as_int();
      if (i < 0) i += len;
      if (i < 0 || i >= len) return Value();
      return chars[static_cast<size_t>(i)];
    }
    return Value();
  }

  Value slice(const Node& n) {
    const Value obj = eval(*n.kids[0]);
    auto opt = [&](size_t k) -> std::optional<int64_t> {
      if (!n.kids[k]) return std::nullopt;
      const Value v = eval(*n.kids[k]);
      if (v.is_none()) return std::nullopt;
      if (v.type() != Value::Type::Int) error(n, "slice indices must be integers");
      return v.as_int();
    };
    const auto start = opt(1), stop = opt(2), step_o = opt(3);
    const int64_t step = step_o.value_or(1);
    if (step == 0) error(n, "slice step cannot be zero");
    List items = obj.is_list() ? obj.as_list() : obj.is_string() ? iterate(n, obj) : List{};
    if (!obj.is_list() && !obj.is_string()) error(n, fmt::format("'{}' cannot be sliced", type_name(obj)));
    const int64_t len = static_cast<int64_t>(items.size());
    // Python's slice.indices()
    auto clamp = [&](std::optional<int64_t> v, int64_t def_pos, int64_t def_neg) {
      if (!v) return step > 0 ? def_pos : def_neg;
      int64_t x = *v;
      if (x < 0) x += len;
      if (step > 0) return std::clamp<int64_t>(x, 0, len);
      return std::clamp<int64_t>(x, -1, len - 1);
    };
    const int64_t b = clamp(start, 0, len - 1), e = clamp(stop, len, -1);
    List out;
    if (step > 0)
      for (int64_t i = b; i < e; i += step) out.push_back(items[static_cast<size_t>(i)]);
    else
      for (int64_t i = b; i > e; i += step) out.push_back(items[static_cast<size_t>(i)]);
    if (obj.is_string()) {
      std::string s;
      for (const Value& c : out) s += c.as_string();
      return Value(s);
    }
    return Value(std::move(out));
  }

  Args eval_args(const Node& n, size_t first) {
    Args a;
    for (size_t k = first; k < n.kids.size(); ++k) a.positional.push_back(eval(*n.kids[k]));
    for (const auto& [key, e] : n.kwargs) a.keyword.emplace_back(key, eval(*e));
    return a;
  }

  Value call(const Node& n) {
    const Node& callee = *n.kids[0];
    // Globals that need the interpreter.
    if (callee.kind == K::Name && lookup(callee.name).is_undefined()) {
      Args a = eval_args(n, 1);
      if (callee.name == "namespace") {
        Dict d;
        for (const Value& p : a.positional) {
          if (!p.is_dict()) error(n, "namespace() positional arguments must be dicts");
          for (const auto& kv : p.as_dict()) d.push_back(kv);
        }
        for (auto& kv : a.keyword) d.emplace_back(kv.first, kv.second);
        return Value(std::move(d), /*is_namespace=*/true);
      }
      if (callee.name == "raise_exception") error(n, "raise_exception: " + a.get(0, "message").str());
      if (callee.name == "range") {
        int64_t start = 0, stop = 0, step = 1;
        if (a.positional.size() == 1) stop = a.positional[0].as_int();
        else if (a.positional.size() >= 2) start = a.positional[0].as_int(), stop = a.positional[1].as_int();
        if (a.positional.size() >= 3) step = a.positional[2].as_int();
        if (step == 0) error(n, "range() step must not be zero");
        const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
        if (count > static_cast<double>(kMaxItems)) error(n, fmt::format("range() of {} items is more than a template may make ({})", count, kMaxItems));
        List l;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) l.emplace_back(i);
        return Value(std::move(l));
      }
      if (callee.name == "dict") {
        Dict d;
        for (auto& kv : a.keyword) d.emplace_back(kv.first, kv.second);
        return Value(std::move(d));
      }
      if (callee.name == "strftime_now") {
        const std::time_t t = std::time(nullptr);
        std::tm tm{};
        localtime_r(&t, &tm);
        char buf[256];
        const size_t len = std::strftime(buf, sizeof buf, a.get(0, "format", Value("")).str().c_str(), &tm);
        return Value(std::string(buf, len));
      }
      error(n, fmt::format("'{}' is undefined", callee.name));
    }
    const Value f = eval(callee);
    if (f.type() != Value::Type::Function) error(n, fmt::format("'{}' is not callable", describe_expr(callee)));
    Args a = eval_args(n, 1);
    if (call_depth_ >= kMaxCallDepth) error(n, fmt::format("calls nested deeper than {} (a macro that calls itself without end?)", kMaxCallDepth));
    ++call_depth_;
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{call_depth_};
    try {
      return f.as_function()(a);
    } catch (const TemplateError& e) {  // a method's own error ("split(): empty separator") gets the call's place
      const std::string msg = e.what();
      if (msg.rfind(name_ + ":", 0) == 0) throw;
      error(n, msg);
    } catch (const std::exception& e) {
      error(n, e.what());
    }
  }

  // ---- operators ----

  Value binary(const Node& n, const Value& a, const Value& b) {
    const std::string& op = n.name;
    if (op == "~") return Value(a.str() + b.str());
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
      if (a.is_list() && b.is_list()) {
        List l = a.as_list();
        l.insert(l.end(), b.as_list().begin(), b.as_list().end());
        return Value(std::move(l));
      }
    }
    if (a.is_undefined() || b.is_undefined()) error(n, fmt::format("undefined value in '{}' expression", op));
    const bool ints = (a.type() == Value::Type::Int || a.type() == Value::Type::Bool) && (b.type() == Value::Type::Int || b.type() == Value::Type::Bool);
    auto num = [](const Value& v) { return v.type() == Value::Type::Bool ? (v.as_bool() ? 1.0 : 0.0) : v.as_number(); };
    auto inum = [](const Value& v) { return v.type() == Value::Type::Bool ? (v.as_bool() ? 1 : 0) : v.as_int(); };
    const bool numbers = (a.is_number() || a.type() == Value::Type::Bool) && (b.is_number() || b.type() == Value::Type::Bool);
    if (op == "*" && a.is_string() && b.type() == Value::Type::Int) {
      if (b.as_int() > 0 && static_cast<double>(a.as_string().size()) * static_cast<double>(b.as_int()) > static_cast<double>(kMaxItems))
        error(n, fmt::format("a string repeated {} times is more than a template may make ({} bytes)", b.as_int(), kMaxItems));
      std::string s;
      for (int64_t i = 0; i < b.as_int(); ++i) s += a.as_string();
      return Value(s);
    }
    if (!numbers) error(n, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
    // Integers stay 64-bit: a result beyond that is an error (Python would grow the integer; no template needs it).
    if (ints && (op == "+" || op == "-" || op == "*")) {
      const int64_t x = inum(a), y = inum(b);
      int64_t r = 0;
      const bool overflow = op == "+" ? __builtin_add_overflow(x, y, &r) : op == "-" ? __builtin_sub_overflow(x, y, &r) : __builtin_mul_overflow(x, y, &r);
      if (overflow) error(n, fmt::format("integer overflow in '{}'", op));
      return Value(r);
    }
    if (op == "+") return Value(num(a) + num(b));
    if (op == "-") return Value(num(a) - num(b));
    if (op == "*") return Value(num(a) * num(b));
    if (op == "/") {
      if (num(b) == 0) error(n, "division by zero");
      return Value(num(a) / num(b));
    }
    if (op == "//") {
      if (num(b) == 0) error(n, "integer division by zero");
      if (ints) {
        const int64_t x = inum(a), y = inum(b);
        if (x == INT64_MIN && y == -1) error(n, "integer overflow in '//'");
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value(q);
      }
      return Value(std::floor(num(a) / num(b)));
    }
    if (op == "%") {
      if (num(b) == 0) error(n, "modulo by zero");
      if (ints) {
        const int64_t x = inum(a), y = inum(b);
        if (y == -1) return Value(int64_t{0});  // x % -1 is 0; INT64_MIN % -1 traps
        int64_t r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value(r);
      }
      double r = std::fmod(num(a), num(b));
      if (r != 0 && ((r < 0) != (num(b) < 0))) r += num(b);
      return Value(r);
    }
    if (op == "**") {
      if (ints && inum(b) >= 0) {  // by squaring: at most 63 squarings, each checked (found by fuzzing: 2 ** 106)
        int64_t r = 1, base = inum(a);
        for (int64_t e = inum(b); e > 0; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(r, base, &r)) error(n, "integer overflow in '**'");
          // A higher bit is left, so this square (or a larger power) multiplies into r: its overflow is r's.
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) error(n, "integer overflow in '**'");
        }
        return Value(r);
      }
      return Value(std::pow(num(a), num(b)));
    }
    error(n, "unknown operator " + op);
  }

  bool contains(const Node& n, const Value& container, const Value& item) {
    if (container.is_string()) {
      if (!item.is_string()) error(n, "'in <string>' requires a string as left operand");
      return container.as_string().find(item.as_string()) != std::string::npos;
    }
    if (container.is_list()) {
      for (const Value& v : container.as_list())
        if (v == item) return true;
      return false;
    }
    if (container.is_dict()) return item.is_string() && container.get(item.as_string()) != nullptr;
    if (container.is_undefined()) error(n, "'in' with an undefined container");
    error(n, fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }

  int order(const Node& n, const Value& a, const Value& b) {
    if ((a.is_number() || a.type() == Value::Type::Bool) && (b.is_number() || b.type() == Value::Type::Bool)) {
      const double x = a.type() == Value::Type::Bool ? a.as_bool() : a.as_number();
      const double y = b.type() == Value::Type::Bool ? b.as_bool() : b.as_number();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) return a.as_string() < b.as_string() ? -1 : a.as_string() > b.as_string() ? 1 : 0;
    if (a.is_list() && b.is_list()) {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
        const int c = order(n, x[i], y[i]);
        if (c) return c;
      }
      return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
    }
    error(n, fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b)));
  }

  bool compare(const Node& n, const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return a == b;
    if (op == "!=") return !(a == b);
    if (op == "in") return contains(n, b, a);
    if (op == "not in") return !contains(n, b, a);
    const int c = order(n, a, b);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  // ---- methods of str, dict, list ----

  Value method(const Node& n, const Value& obj, const std::string& name);

  // ---- filters and tests ----

  Value apply_filter(const Node& f, const Value& input);
  Value filter_by_name(const Node& at, const std::string& name, const Value& input, Args& a);
  bool run_test(const Node& t);
  bool test_by_name(const Node& at, const std::string& name, const Value& v, Args& a);

  std::string name_;
  RenderResult& out_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int loop_depth_ = 0;
  int call_depth_ = 0;  // function and macro calls being evaluated
};

// Python's str.strip family: `chars` none = whitespace.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto strip_char = [&](const std::string& ch) {
    if (chars.is_undefined() || chars.is_none()) return ch.size() == 1 && is_py_space(static_cast<unsigned char>(ch[0]));
    return chars.as_string().find(ch) != std::string::npos;
  };
  // Work on code points so that multi-byte `chars` work.
  std::vector<std::string> cps;
  for (size_t i = 0; i < s.size();) {
    const size_t n = unicode::utf8_length(static_cast<unsigned char>(s[i]));
    cps.push_back(s.substr(i, n));
    i += n;
  }
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_char(cps[b])) ++b;
  if (right)
    while (e > b && strip_char(cps[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

List py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is_undefined() || sep.is_none()) {
    size_t i = 0;
    int64_t splits = 0;
    while (i < s.size()) {
      while (i < s.size() && is_py_space(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && splits >= maxsplit) {
        std::string rest = s.substr(i);
        while (!rest.empty() && is_py_space(static_cast<unsigned char>(rest.back()))) rest.pop_back();
        out.emplace_back(rest);
        return out;
      }
      size_t j = i;
      while (j < s.size() && !is_py_space(static_cast<unsigned char>(s[j]))) ++j;
      out.emplace_back(s.substr(i, j - i));
      ++splits;
      i = j;
    }
    return out;
  }
  const std::string& d = sep.as_string();
  if (d.empty()) throw TemplateError("split(): empty separator");
  size_t i = 0;
  int64_t splits = 0;
  while (true) {
    const size_t j = s.find(d, i);
    if (j == std::string::npos || (maxsplit >= 0 && splits >= maxsplit)) {
      out.emplace_back(s.substr(i));
      return out;
    }
    out.emplace_back(s.substr(i, j - i));
    i = j + d.size();
    ++splits;
  }
}

std::string py_replace(std::string s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  size_t p = 0;
  int64_t done = 0;
  while ((count < 0 || done < count) && (p = s.find(from, p)) != std::string::npos) {
    s.replace(p, from.size(), to);
    p += to.size();
    ++done;
  }
  return s;
}

std::string py_case(const std::string& s, int mode) {  // 0 lower, 1 upper
  return mode == 0 ? unicode::lowercase(s) : [&] {
    std::string out;
    for (size_t i = 0; i < s.size();) {
      const size_t n = unicode::utf8_length(static_cast<unsigned char>(s[i]));
      if (n == 1) out += static_cast<char>(std::toupper(static_cast<unsigned char>(s[i])));
      else out += s.substr(i, n);
      i += n;
    }
    return out;
  }();
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      out += prev_cased ? static_cast<char>(std::tolower(u)) : static_cast<char>(std::toupper(u));
      prev_cased = true;
    } else {
      out += c;
      prev_cased = false;
    }
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out = unicode::lowercase(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

Value Interpreter::method(const Node& n, const Value& obj, const std::string& name) {
  (void)n;
  if (obj.is_string()) {
    const std::string s = obj.as_string();
    if (name == "startswith" || name == "endswith") {
      const bool starts = name == "startswith";
      return Value(Function([s, starts](Args& a) {
        const Value p = a.get(0, "prefix");
        auto check = [&](const std::string& x) {
          if (x.size() > s.size()) return false;
          return starts ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
        };
        if (p.is_list()) {
          for (const Value& x : p.as_list())
            if (x.is_string() && check(x.as_string())) return Value(true);
          return Value(false);
        }
        if (!p.is_string()) throw TemplateError(std::string(starts ? "startswith" : "endswith") + "(): argument must be a string");
        return Value(check(p.as_string()));
      }));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool l = name != "rstrip", r = name != "lstrip";
      return Value(Function([s, l, r](Args& a) { return Value(py_strip(s, a.get(0, "chars"), l, r)); }));
    }
    if (name == "split") return Value(Function([s](Args& a) {
      const Value m = a.get(1, "maxsplit", Value(-1));
      return Value(py_split(s, a.get(0, "sep"), m.as_int()));
    }));
    if (name == "rsplit") return Value(Function([s](Args& a) {
      const Value m = a.get(1, "maxsplit", Value(-1));
      if (m.as_int() >= 0) throw TemplateError("rsplit() with maxsplit is not supported");
      return Value(py_split(s, a.get(0, "sep"), -1));
    }));
    if (name == "splitlines") return Value(Function([s](Args&) {
      List out;
      size_t i = 0;
      while (i < s.size()) {
        size_t j = s.find_first_of("\r\n", i);
        if (j == std::string::npos) {
          out.emplace_back(s.substr(i));
          break;
        }
        out.emplace_back(s.substr(i, j - i));
        i = j + ((s[j] == '\r' && j + 1 < s.size() && s[j + 1] == '\n') ? 2 : 1);
      }
      return Value(std::move(out));
    }));
    if (name == "upper") return Value(Function([s](Args&) { return Value(py_case(s, 1)); }));
    if (name == "lower") return Value(Function([s](Args&) { return Value(py_case(s, 0)); }));
    if (name == "title") return Value(Function([s](Args&) { return Value(py_title(s)); }));
    if (name == "capitalize") return Value(Function([s](Args&) { return Value(py_capitalize(s)); }));
    if (name == "replace") return Value(Function([s](Args& a) {
      return Value(py_replace(s, a.get(0, "old").str(), a.get(1, "new").str(), a.get(2, "count", Value(-1)).as_int()));
    }));
    if (name == "find" || name == "rfind" || name == "index" || name == "count") {
      return Value(Function([s, name](Args& a) {
        const std::string x = a.get(0, "sub").str();
        if (name == "count") {
          if (x.empty()) return Value(static_cast<int64_t>(s.size() + 1));
          int64_t c = 0;
          for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++c;
          return Value(c);
        }
        const size_t p = name == "rfind" ? s.rfind(x) : s.find(x);
        if (p == std::string::npos) {
          if (name == "index") throw TemplateError("substring not found");
          return Value(static_cast<int64_t>(-1));
        }
        return Value(static_cast<int64_t>(p));
      }));
    }
    if (name == "join") return Value(Function([s](Args& a) {
      std::string out;
      bool first = true;
      const Value items = a.get(0, "iterable");
      if (!items.is_list()) throw TemplateError("join() needs a list");
      for (const Value& v : items.as_list()) {
        if (!first) out += s;
        first = false;
        out += v.str();
      }
      return Value(out);
    }));
    if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" || name == "isupper") {
      return Value(Function([s, name](Args&) {
        if (s.empty()) return Value(false);
        bool cased = false;
        for (unsigned char c : s) {
          if (name == "isdigit" && !std::isdigit(c)) return Value(false);
          if (name == "isalpha" && !std::isalpha(c)) return Value(false);
          if (name == "isalnum" && !std::isalnum(c)) return Value(false);
          if (name == "isspace" && !is_py_space(c)) return Value(false);
          if (name == "islower" && std::isupper(c)) return Value(false);
          if (name == "isupper" && std::islower(c)) return Value(false);
          cased = cased || std::isalpha(c);
        }
        return Value(name == "islower" || name == "isupper" ? cased : true);
      }));
    }
    return Value();
  }
  if (obj.is_dict()) {
    const Value d = obj;
    if (name == "items") return Value(Function([d](Args&) {
      List out;
      for (const auto& [k, v] : d.as_dict()) out.emplace_back(List{Value(k), v});
      return Value(std::move(out));
    }));
    if (name == "keys") return Value(Function([d](Args&) {
      List out;
      for (const auto& kv : d.as_dict()) out.emplace_back(kv.first);
      return Value(std::move(out));
    }));
    if (name == "values") return Value(Function([d](Args&) {
      List out;
      for (const auto& kv : d.as_dict()) out.push_back(kv.second);
      return Value(std::move(out));
    }));
    if (name == "get") return Value(Function([d](Args& a) {
      const Value k = a.get(0, "key");
      if (k.is_string())
        if (const Value* v = d.get(k.as_string())) return *v;
      return a.get(1, "default", Value::none());
    }));
    if (name == "update" || name == "pop" || name == "setdefault" || name == "clear") {
      return Value(Function([name](Args&) -> Value { throw TemplateError("dicts are immutable in chat templates (" + name + "())"); }));
    }
    return Value();
  }
  if (obj.is_list()) {
    if (name == "append" || name == "extend" || name == "pop" || name == "insert" || name == "remove" || name == "sort" || name == "reverse") {
      return Value(Function([name](Args&) -> Value { throw TemplateError("lists are immutable in chat templates (" + name + "())"); }));
    }
    const Value l = obj;
    if (name == "index" || name == "count") return Value(Function([l, name](Args& a) {
      const Value x = a.get(0, "value");
      int64_t c = 0;
      for (size_t i = 0; i < l.as_list().size(); ++i) {
        if (l.as_list()[i] == x) {
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++c;
        }
      }
      if (name == "index") throw TemplateError("value is not in list");
      return Value(c);
    }));
  }
  return Value();
}

int64_t length_of(const Value& v) {
  if (v.is_string()) {
    int64_t n = 0;
    for (unsigned char c : v.as_string()) n += (c & 0xc0) != 0x80;
    return n;
  }
  if (v.is_list()) return static_cast<int64_t>(v.as_list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.as_dict().size());
  if (v.is_undefined()) return 0;
  throw TemplateError("object has no length");
}

Value Interpreter::apply_filter(const Node& f, const Value& input) {
  Args a = eval_args(f, 1);
  try {
    return filter_by_name(f, f.name, input, a);
  } catch (const TemplateError& e) {
    const std::string msg = e.what();
    if (msg.rfind(name_ + ":", 0) == 0) throw;
    error(f, "filter '" + f.name + "': " + msg);
  }
}

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.is_dict()) {
      const Value* x = cur.get(part);
      cur = x ? *x : Value();
    } else if (cur.is_list() && !part.empty() && std::isdigit(static_cast<unsigned char>(part[0]))) {
      const std::optional<int64_t> i = parse_int64(part);
      cur = i && static_cast<uint64_t>(*i) < cur.as_list().size() ? cur.as_list()[static_cast<size_t>(*i)] : Value();
    } else {
      return Value();
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value Interpreter::filter_by_name(const Node& at, const std::string& name, const Value& v, Args& a) {
  auto need_string = [&]() -> const std::string& {
    if (!v.is_string()) throw TemplateError(fmt::format("expected a string, got {}", type_name(v)));
    return v.as_string();
  };
  if (name == "tojson") {
    const Value indent = a.get(0, "indent");
    const Value sep = a.get(2, "separators");
    std::string item_sep, key_sep;
    const std::string* is = nullptr;
    const std::string* ks = nullptr;
    if (sep.is_list() && sep.as_list().size() == 2) {
      item_sep = sep.as_list()[0].str(), key_sep = sep.as_list()[1].str();
      is = &item_sep, ks = &key_sep;
    }
    return Value(v.to_json(indent.type() == Value::Type::Int ? static_cast<int>(indent.as_int()) : -1, a.get(3, "sort_keys").truthy(), is, ks));
  }
  if (name == "trim") return Value(py_strip(need_string(), a.get(0, "chars"), true, true));
  if (name == "length" || name == "count") return Value(length_of(v));
  if (name == "string") return Value(v.str());
  if (name == "lower") return Value(py_case(v.str(), 0));
  if (name == "upper") return Value(py_case(v.str(), 1));
  if (name == "title") return Value(py_title(v.str()));
  if (name == "capitalize") return Value(py_capitalize(v.str()));
  if (name == "replace") return Value(py_replace(v.str(), a.get(0, "old").str(), a.get(1, "new").str(), a.get(2, "count", Value(-1)).as_int()));
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return v;
    std::string out;
    for (char c : v.str()) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    return Value(out);
  }
  if (name == "join") {
    const std::string d = a.get(0, "d", Value("")).str();
    const Value attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(at, v)) {
      if (!first) out += d;
      first = false;
      out += (attr.is_string() ? attribute_of(x, attr.as_string()) : x).str();
    }
    return Value(out);
  }
  if (name == "default" || name == "d") {
    const Value def = a.get(0, "default_value", Value(""));
    const bool boolean = a.get(1, "boolean").truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return def;
    return v;
  }
  if (name == "items") {
    if (v.is_undefined()) return Value(List{});
    if (!v.is_dict()) throw TemplateError("items needs a mapping");
    List out;
    for (const auto& [k, x] : v.as_dict()) out.emplace_back(List{Value(k), x});
    return Value(std::move(out));
  }
  if (name == "list") return Value(iterate(at, v));
  if (name == "first" || name == "last") {
    const List l = iterate(at, v);
    if (l.empty()) return Value();
    return name == "first" ? l.front() : l.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      List chars = iterate(at, v);
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->as_string();
      return Value(out);
    }
    List l = iterate(at, v);
    std::reverse(l.begin(), l.end());
    return Value(std::move(l));
  }
  if (name == "unique") {
    List out;
    for (const Value& x : iterate(at, v)) {
      bool seen = false;
      for (const Value& y : out) seen = seen || y == x;
      if (!seen) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "sort" || name == "dictsort") {
    List l = name == "dictsort" ? filter_by_name(at, "items", v, a).as_list() : iterate(at, v);
    const bool reverse = a.get(name == "dictsort" ? 2 : 0, "reverse").truthy();
    const Value attr = a.get(2, "attribute");
    std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
      const Value kx = attr.is_string() ? attribute_of(x, attr.as_string()) : (name == "dictsort" ? x.as_list()[0] : x);
      const Value ky = attr.is_string() ? attribute_of(y, attr.as_string()) : (name == "dictsort" ? y.as_list()[0] : y);
      const int c = order(at, kx, ky);
      return reverse ? c > 0 : c < 0;
    });
    return Value(std::move(l));
  }
  if (name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    List out;
    const List items = iterate(at, v);
    if (name == "map") {
      const Value attr = a.get(99, "attribute");
      if (attr.is_string()) {
        const Value def = a.get(99, "default");
        for (const Value& x : items) {
          Value y = attribute_of(x, attr.as_string());
          out.push_back(y.is_undefined() && !def.is_undefined() ? def : y);
        }
        return Value(std::move(out));
      }
      if (a.positional.empty()) throw TemplateError("map needs a filter name or attribute=");
      const std::string f = a.positional[0].str();
      Args rest;
      rest.positional.assign(a.positional.begin() + 1, a.positional.end());
      for (const Value& x : items) out.push_back(filter_by_name(at, f, x, rest));
      return Value(std::move(out));
    }
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool select = name == "select" || name == "selectattr";
    const size_t test_pos = by_attr ? 1 : 0;
    for (const Value& x : items) {
      Value subject = by_attr ? attribute_of(x, a.get(0, "attribute").str()) : x;
      bool ok;
      if (a.positional.size() > test_pos) {
        Args rest;
        rest.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(test_pos) + 1, a.positional.end());
        ok = test_by_name(at, a.positional[test_pos].str(), subject, rest);
      } else {
        ok = subject.truthy();
      }
      if (ok == select) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "attr") return attribute_of(v, a.get(0, "name").str());
  if (name == "int") {
    if (v.type() == Value::Type::Int) return v;
    if (v.type() == Value::Type::Float) {  // beyond int64 (or nan): the default, as a failed conversion
      const double x = v.as_number();
      return std::isfinite(x) && std::fabs(x) < 9.2e18 ? Value(static_cast<int64_t>(x)) : a.get(0, "default", Value(0));
    }
    if (v.type() == Value::Type::Bool) return Value(static_cast<int64_t>(v.as_bool()));
    try {
      return Value(static_cast<int64_t>(std::stoll(v.str())));
    } catch (...) {
      return a.get(0, "default", Value(0));
    }
  }
  if (name == "float") {
    if (v.is_number()) return Value(v.as_number());
    try {
      return Value(std::stod(v.str()));
    } catch (...) {
      return a.get(0, "default", Value(0.0));
    }
  }
  if (name == "abs") {
    if (v.type() == Value::Type::Int) return Value(static_cast<int64_t>(std::llabs(v.as_int())));
    return Value(std::fabs(v.as_number()));
  }
  if (name == "round") {
    const int64_t precision = a.get(0, "precision", Value(0)).as_int();
    const std::string method_name = a.get(1, "method", Value("common")).str();
    const double scale = std::pow(10.0, static_cast<double>(precision));
    double x = v.as_number() * scale;
    x = method_name == "ceil" ? std::ceil(x) : method_name == "floor" ? std::floor(x) : std::round(x);
    return Value(x / scale);
  }
  if (name == "sum") {
    bool all_int = true;
    double s = 0;
    int64_t si = 0;
    const Value attr = a.get(0, "attribute");
    for (const Value& x0 : iterate(at, v)) {
      const Value x = attr.is_string() ? attribute_of(x0, attr.as_string()) : x0;
      if (x.type() != Value::Type::Int) all_int = false;
      s += x.as_number();
      if (x.type() == Value::Type::Int) si += x.as_int();
    }
    return all_int ? Value(si) : Value(s);
  }
  if (name == "min" || name == "max") {
    const List l = iterate(at, v);
    if (l.empty()) return Value();
    Value best = l[0];
    for (const Value& x : l)
      if ((name == "min" ? order(at, x, best) < 0 : order(at, x, best) > 0)) best = x;
    return best;
  }
  if (name == "indent") {
    const Value w = a.get(0, "width", Value(4));
    if (!w.is_string() && (w.as_int() < 0 || w.as_int() > kMaxItems)) throw TemplateError(fmt::format("indent width {} is out of range", w.as_int()));
    const std::string pad = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(w.as_int()), ' ');
    const bool first = a.get(1, "first").truthy(), blank = a.get(2, "blank").truthy();
    const List lines = py_split(v.str(), Value("\n"), -1);
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) out += "\n";
      const std::string& line = lines[i].as_string();
      if ((i > 0 || first) && (blank || !line.empty())) out += pad;
      out += line;
    }
    return Value(out);
  }
  if (name == "wordcount") return Value(static_cast<int64_t>(py_split(v.str(), Value(), -1).size()));
  if (name == "center") {
    const int64_t w = a.get(0, "width", Value(80)).as_int();
    if (w > kMaxItems) throw TemplateError(fmt::format("center width {} is more than a template may make ({})", w, kMaxItems));
    const std::string s = v.str();
    const int64_t len = length_of(Value(s));
    if (len >= w) return Value(s);
    const int64_t total = w - len, left = total / 2 + (total & w & 1);
    return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(total - left), ' '));
  }
  if (name == "batch") {
    const int64_t size = a.get(0, "linecount").as_int();
    if (size <= 0) throw TemplateError("batch size must be positive");
    List out, cur;
    for (const Value& x : iterate(at, v)) {
      cur.push_back(x);
      if (static_cast<int64_t>(cur.size()) == size) out.emplace_back(std::move(cur)), cur.clear();
    }
    if (!cur.empty()) out.emplace_back(std::move(cur));
    return Value(std::move(out));
  }
  throw TemplateError(fmt::format("no filter named '{}'", name));
}

bool Interpreter::run_test(const Node& t) {
  const Value v = eval(*t.kids[0]);
  Args a = eval_args(t, 1);
  try {
    return test_by_name(t, t.name, v, a);
  } catch (const TemplateError& e) {
    const std::string msg = e.what();
    if (msg.rfind(name_ + ":", 0) == 0) throw;
    error(t, "test '" + t.name + "': " + msg);
  }
}

bool Interpreter::test_by_name(const Node& at, const std::string& name, const Value& v, Args& a) {
  using T = Value::Type;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.type() == T::Int;
  if (name == "float") return v.type() == T::Float;
  if (name == "boolean") return v.type() == T::Bool;
  if (name == "true") return v.type() == T::Bool && v.as_bool();
  if (name == "false") return v.type() == T::Bool && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.type() == T::Function;
  if (name == "odd") return v.type() == T::Int && (v.as_int() % 2 != 0);
  if (name == "even") return v.type() == T::Int && v.as_int() % 2 == 0;
  if (name == "divisibleby") {
    const int64_t d = a.get(0, "num").as_int();
    return d != 0 && v.as_int() % d == 0;
  }
  if (name == "lower") return v.is_string() && py_case(v.as_string(), 0) == v.as_string();
  if (name == "upper") return v.is_string() && py_case(v.as_string(), 1) == v.as_string();
  if (name == "in") return contains(at, a.get(0, "seq"), v);
  const Value other = a.get(0, "other");
  if (name == "eq" || name == "equalto" || name == "==") return v == other;
  if (name == "ne" || name == "!=") return !(v == other);
  if (name == "sameas") return v == other && v.type() == other.type();
  if (name == "lt" || name == "lessthan" || name == "<") return order(at, v, other) < 0;
  if (name == "le" || name == "<=") return order(at, v, other) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return order(at, v, other) > 0;
  if (name == "ge" || name == ">=") return order(at, v, other) >= 0;
  throw TemplateError(fmt::format("no test named '{}'", name));
}

}  // namespace

Template::Template(const std::string& source, std::string name) : name_(std::move(name)) {
  Lexer lexer(source, name_);
  Parser parser(lexer.run(), name_);
  auto root = std::make_shared<Node>();
  root->kind = K::Text;
  root->bodies.push_back(parser.parse_template());
  root_ = root;
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

RenderResult Template::render(const Value& context) const {
  RenderResult out;
  Interpreter in(name_, out);
  in.push_scope();
  if (context.is_dict())
    for (const auto& [k, v] : context.as_dict()) in.set_var(k, v);
  in.push_scope();
  try {
    in.exec(root_->bodies[0]);
  } catch (const BreakSignal&) {
    throw TemplateError(name_ + ": 'break' outside a loop");
  } catch (const ContinueSignal&) {
    throw TemplateError(name_ + ": 'continue' outside a loop");
  }
  return out;
}

}  // namespace trl::jinja

#include "trl/tokenizer/tokenizer.h"
#include "core/json_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>
// GCC 12 reports a false -Wdangling-pointer inside simdjson's inline DOM iterators (simdjson.h tape_ref).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
#include <simdjson.h>

#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/io/hub.h"
#include "tokenizer/unicode.h"

namespace trl {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Regex (PCRE2 with UTF + UCP, JIT-compiled): the Split pre-tokenizer and Replace normalizer/decoder patterns.

// tokenizers compiles its patterns with Oniguruma, whose \s is Unicode's White_Space property; PCRE2's \s with UCP
// also matches U+180E. Rewriting \s and \S to the property makes the two engines agree.
std::string onig_compatible(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      if (n == 's') out += "\\p{White_Space}";
      else if (n == 'S') out += "\\P{White_Space}";
      else out += pattern.substr(i, 2);
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& source_pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    const std::string pattern = onig_compatible(source_pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("{}: cannot compile the regex /{}/ at offset {}: {}", where, source_pattern, offset, reinterpret_cast<char*>(msg));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() {
    if (code_) pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(begin, end) for every non-overlapping match, left to right.
  template <typename F>
  void for_each_match(std::string_view s, F&& f) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    PCRE2_SIZE start = 0;
    while (start <= s.size()) {
      int rc = jit_ ? pcre2_jit_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr)
                    : pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: skip one code point
        if (b >= s.size()) break;
        start = b + unicode::utf8_length(static_cast<unsigned char>(s[b]));
        continue;
      }
      f(b, e);
      start = e;
    }
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

std::string escape_regex(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// A pattern field {"String": "..."} or {"Regex": "..."}.
std::unique_ptr<Regex> pattern_of(const json& p, const std::string& where) {
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) return std::make_unique<Regex>(p["Regex"].get<std::string>(), where);
  if (p.is_object() && p.contains("String") && p["String"].is_string()) return std::make_unique<Regex>(escape_regex(p["String"].get<std::string>()), where);
  fail("{}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
}

std::string str_field(const json& j, const char* key, const std::string& where, const std::string& def = "") {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_string()) fail("{}: '{}' must be a string", where, key);
  return j[key].get<std::string>();
}
bool bool_field(const json& j, const char* key, bool def) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : def;
}
// Token ids above this are no vocabulary's (the largest have a few hundred thousand): a bound before any table is
// sized by an id read from the file.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

// j[key] when j is an object that has it; null otherwise (an absent field).
const json& member(const json& j, const char* key) {
  static const json absent;
  if (!j.is_object()) return absent;
  const auto it = j.find(key);
  return it == j.end() ? absent : *it;
}
// A list field: absent or null is empty; anything else but a list is an error naming where and the key.
const json& list_field(const json& j, const char* key, const std::string& where) {
  static const json empty = json::array();
  const json& v = member(j, key);
  if (v.is_null()) return empty;
  if (!v.is_array()) fail("{}: '{}' must be a list, got {}", where, key, json_kind(v));
  return v;
}
// A whole-number field: absent or null is `def`.
int64_t int_field(const json& j, const char* key, const std::string& where, int64_t def) {
  const json& v = member(j, key);
  return v.is_null() ? def : json_field<int64_t>(j, key, where);
}
// A pipeline step (normalizer, pre-tokenizer, decoder, post-processor) is an object with a "type".
void check_step(const json& j, const std::string& where) {
  if (!j.is_object()) fail("{}: must be an object with a \"type\", got {}", where, json_kind(j));
}

// ---------------------------------------------------------------------------------------------------------------
// Normalizers

struct Normalizer {
  enum Kind { NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend } kind;
  bool left = true, right = true;  // Strip
  std::unique_ptr<Regex> pattern;  // Replace
  std::string content;             // Replace / Prepend
};

void parse_normalizer(const json& j, std::vector<Normalizer>& out, const std::string& where) {
  if (j.is_null()) return;
  check_step(j, where);
  const std::string type = str_field(j, "type", where);
  const std::string w = where + " (" + type + ")";
  if (type == "Sequence") {
    for (const json& n : list_field(j, "normalizers", where)) parse_normalizer(n, out, where);
    return;
  }
  Normalizer n{};
  if (type == "NFC") n.kind = Normalizer::NFC;
  else if (type == "NFD") n.kind = Normalizer::NFD;
  else if (type == "NFKC") n.kind = Normalizer::NFKC;
  else if (type == "NFKD") n.kind = Normalizer::NFKD;
  else if (type == "Lowercase") n.kind = Normalizer::Lowercase;
  else if (type == "Strip") n.kind = Normalizer::Strip, n.left = bool_field(j, "strip_left", true), n.right = bool_field(j, "strip_right", true);
  else if (type == "Replace") n.kind = Normalizer::Replace, n.pattern = pattern_of(member(j, "pattern"), w), n.content = str_field(j, "content", w);
  else if (type == "Prepend") n.kind = Normalizer::Prepend, n.content = str_field(j, "prepend", w);
  else fail("{}: normalizer '{}' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend)", where, type);
  out.push_back(std::move(n));
}

bool is_ws(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0d) || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
         c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string replace_all(const Regex& re, std::string_view s, const std::string& with) {
  std::string out;
  size_t last = 0;
  re.for_each_match(s, [&](size_t b, size_t e) {
    out.append(s.substr(last, b - last));
    out += with;
    last = e;
  });
  out.append(s.substr(last));
  return out;
}

std::string strip_ws(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t i = b;
      if (!is_ws(unicode::next_code_point(s, i))) break;
      b = i;
    }
  }
  if (right) {
    while (e > b) {
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xc0) == 0x80) --k;
      size_t i = k;
      if (!is_ws(unicode::next_code_point(s, i))) break;
      e = k;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::string normalize(const std::vector<Normalizer>& steps, std::string s) {
  for (const Normalizer& n : steps) {
    switch (n.kind) {
      case Normalizer::NFC: s = unicode::nfc(s); break;
      case Normalizer::NFD: s = unicode::nfd(s); break;
      case Normalizer::NFKC: s = unicode::nfkc(s); break;
      case Normalizer::NFKD: s = unicode::nfkd(s); break;
      case Normalizer::Lowercase: s = unicode::lowercase(s); break;
      case Normalizer::Strip: s = strip_ws(s, n.left, n.right); break;
      case Normalizer::Replace: s = replace_all(*n.pattern, s, n.content); break;
      case Normalizer::Prepend:
        if (!s.empty()) s = n.content + s;
        break;
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Pre-tokenizers

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreTokenizer {
  enum Kind { Split, ByteLevel, Digits } kind;
  std::unique_ptr<Regex> regex;  // Split; ByteLevel with use_regex
  enum Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous } behavior = Isolated;
  bool invert = false;
  bool add_prefix_space = false;
  bool individual_digits = false;
};

void parse_pre_tokenizer(const json& j, std::vector<PreTokenizer>& out, const std::string& where) {
  if (j.is_null()) return;
  check_step(j, where);
  const std::string type = str_field(j, "type", where);
  const std::string w = where + " (" + type + ")";
  if (type == "Sequence") {
    for (const json& p : list_field(j, "pretokenizers", where)) parse_pre_tokenizer(p, out, where);
    return;
  }
  PreTokenizer p{};
  if (type == "Split") {
    p.kind = PreTokenizer::Split;
    p.regex = pattern_of(member(j, "pattern"), w);
    const std::string b = str_field(j, "behavior", w, "Isolated");
    if (b == "Removed") p.behavior = PreTokenizer::Removed;
    else if (b == "Isolated") p.behavior = PreTokenizer::Isolated;
    else if (b == "MergedWithPrevious") p.behavior = PreTokenizer::MergedWithPrevious;
    else if (b == "MergedWithNext") p.behavior = PreTokenizer::MergedWithNext;
    else if (b == "Contiguous") p.behavior = PreTokenizer::Contiguous;
    else fail("{}: unknown behavior '{}'", w, b);
    p.invert = bool_field(j, "invert", false);
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::ByteLevel;
    p.add_prefix_space = bool_field(j, "add_prefix_space", true);
    if (bool_field(j, "use_regex", true)) p.regex = std::make_unique<Regex>(kGpt2Pattern, w);
  } else if (type == "Digits") {
    p.kind = PreTokenizer::Digits;
    p.individual_digits = bool_field(j, "individual_digits", false);
    p.regex = std::make_unique<Regex>(p.individual_digits ? "\\p{Nd}" : "\\p{Nd}+", w);
  } else {
    fail("{}: pre-tokenizer '{}' is not supported (supported: Sequence, Split, ByteLevel, Digits)", where, type);
  }
  out.push_back(std::move(p));
}

// Splits `s` by the regex's matches according to `behavior` (tokenizers' SplitDelimiterBehavior).
void split_by(const Regex& re, PreTokenizer::Behavior behavior, bool invert, std::string_view s, std::vector<std::string>& out) {
  // (begin, end, is_match) spans covering s.
  std::vector<std::tuple<size_t, size_t, bool>> spans;
  size_t last = 0;
  re.for_each_match(s, [&](size_t b, size_t e) {
    if (b > last) spans.emplace_back(last, b, invert);
    spans.emplace_back(b, e, !invert);
    last = e;
  });
  if (last < s.size()) spans.emplace_back(last, s.size(), invert);
  switch (behavior) {
    case PreTokenizer::Isolated:
      for (auto& [b, e, m] : spans) out.emplace_back(s.substr(b, e - b));
      break;
    case PreTokenizer::Removed:
      for (auto& [b, e, m] : spans)
        if (!m) out.emplace_back(s.substr(b, e - b));
      break;
    case PreTokenizer::MergedWithPrevious: {
      std::string cur;
      for (auto& [b, e, m] : spans) {
        cur += s.substr(b, e - b);
        if (m) out.push_back(std::move(cur)), cur.clear();
      }
      if (!cur.empty()) out.push_back(cur);
      break;
    }
    case PreTokenizer::MergedWithNext: {
      std::string cur;
      for (auto& [b, e, m] : spans) {
        if (m && !cur.empty()) out.push_back(std::move(cur)), cur.clear();
        cur += s.substr(b, e - b);
      }
      if (!cur.empty()) out.push_back(cur);
      break;
    }
    case PreTokenizer::Contiguous: {
      std::string cur;
      bool cur_m = false;
      for (auto& [b, e, m] : spans) {
        if (!cur.empty() && m != cur_m) out.push_back(std::move(cur)), cur.clear();
        cur += s.substr(b, e - b);
        cur_m = m;
      }
      if (!cur.empty()) out.push_back(cur);
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Decoders

struct Decoder {
  enum Kind { ByteLevel, Replace, Strip, Fuse } kind;
  std::unique_ptr<Regex> pattern;
  std::string content;
  size_t strip_start = 0, strip_stop = 0;
  std::string strip_char;
};

void parse_decoder(const json& j, std::vector<Decoder>& out, const std::string& where) {
  if (j.is_null()) return;
  check_step(j, where);
  const std::string type = str_field(j, "type", where);
  const std::string w = where + " (" + type + ")";
  if (type == "Sequence") {
    for (const json& d : list_field(j, "decoders", where)) parse_decoder(d, out, where);
    return;
  }
  Decoder d{};
  if (type == "ByteLevel") d.kind = Decoder::ByteLevel;
  else if (type == "Fuse") d.kind = Decoder::Fuse;
  else if (type == "Replace") d.kind = Decoder::Replace, d.pattern = pattern_of(member(j, "pattern"), w), d.content = str_field(j, "content", w);
  else if (type == "Strip") {
    d.kind = Decoder::Strip;
    d.strip_char = str_field(j, "content", w, " ");
    if (d.strip_char.empty()) fail("{}: Strip's 'content' must be the character to strip, got \"\"", w);
    for (auto [key, count] : {std::pair<const char*, size_t*>{"start", &d.strip_start}, {"stop", &d.strip_stop}}) {
      const int64_t n = int_field(j, key, w, 0);  // a count of characters (tokenizers' usize)
      if (n < 0 || n > (1 << 20)) fail("{}: Strip's '{}' must be a count of characters from 0 to {}, got {}", w, key, 1 << 20, n);
      *count = static_cast<size_t>(n);
    }
  } else fail("{}: decoder '{}' is not supported (supported: Sequence, ByteLevel, Replace, Strip, Fuse)", where, type);
  out.push_back(std::move(d));
}

// ---------------------------------------------------------------------------------------------------------------
// Post-processors

struct TemplatePiece {
  bool is_sequence = false;
  std::string sequence_id;        // "A" / "B"
  std::vector<int32_t> special;   // ids of a special-token piece
};

struct PostProcessor {
  bool template_processing = false;
  std::vector<TemplatePiece> single;
};

void parse_post_processor(const json& j, PostProcessor& out, const std::string& where) {
  if (j.is_null()) return;
  check_step(j, where);
  const std::string type = str_field(j, "type", where);
  if (type == "Sequence") {
    for (const json& p : list_field(j, "processors", where)) parse_post_processor(p, out, where);
    return;
  }
  if (type == "ByteLevel") return;  // offsets only; ids unchanged
  if (type != "TemplateProcessing") {
    fail("{}: post-processor '{}' is not supported (supported: Sequence, ByteLevel, TemplateProcessing)", where, type);
  }
  out.template_processing = true;
  const json& specials = member(j, "special_tokens");
  for (const json& piece : list_field(j, "single", where)) {
    TemplatePiece tp;
    if (piece.is_object() && piece.contains("Sequence")) {
      tp.is_sequence = true;
      tp.sequence_id = str_field(member(piece, "Sequence"), "id", where + ": single", "A");
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      const std::string id = str_field(member(piece, "SpecialToken"), "id", where + ": single");
      if (!specials.is_object() || !specials.contains(id))
        fail("{}: TemplateProcessing names special token '{}' that special_tokens does not define", where, id);
      for (const json& v : list_field(specials[id], "ids", where + ": special_tokens." + id)) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
          fail("{}: special_tokens.{}: ids must be token ids, got {}", where, id, v.dump());
        tp.special.push_back(static_cast<int32_t>(v.get<int64_t>()));
      }
    } else {
      fail("{}: TemplateProcessing piece {} is neither Sequence nor SpecialToken", where, piece.dump());
    }
    out.single.push_back(std::move(tp));
  }
}

// tokenizer_config.json's eos_token, pad_token, ...: the token's text, or an AddedToken object {"content": ...} as
// Transformers saves it; "" when absent or null. Any other kind is an error naming the file and the key.
std::string special_token_string(const json& cfg, const char* key, const std::string& path) {
  if (!cfg.contains(key) || cfg[key].is_null()) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  if (v.is_object())
    fail("{}: '{}' is an object without a text 'content' (a special token is its text or {{\"content\": TEXT, ...}})", path, key);
  fail("{}: '{}' must be the token's text or {{\"content\": TEXT, ...}}, got {}", path, key, json_kind(v));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string source;
  // BPE model
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left,right) -> (rank, merged id)
  std::array<int32_t, 256> byte_ids{};                               // id of each single byte-level character, or -1
  bool ignore_merges = false;
  std::optional<int32_t> unk_id;
  std::string continuing_subword_prefix, end_of_word_suffix;
  bool byte_fallback = false;
  // Pipeline
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  std::vector<Decoder> decoders;
  PostProcessor post;
  bool byte_level = false;  // a ByteLevel pre-tokenizer maps bytes
  // Added tokens, and a byte trie over their contents for longest-match splitting.
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  struct TrieNode {
    std::unordered_map<unsigned char, int32_t> next;
    int32_t token = -1;  // index into `added`
  };
  std::vector<TrieNode> trie{1};
  // tokenizer_config.json
  std::string eos, pad, bos, unk, chat_template;
  bool cleanup = false;
  // Cache of BPE results for frequent pre-tokens.
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;
  static constexpr size_t kCacheCapacity = 1 << 16;

  void add_to_trie(size_t index) {
    int32_t node = 0;
    for (unsigned char c : added[index].content) {
      auto it = trie[static_cast<size_t>(node)].next.find(c);
      if (it == trie[static_cast<size_t>(node)].next.end()) {
        trie.emplace_back();
        const int32_t fresh = static_cast<int32_t>(trie.size() - 1);
        trie[static_cast<size_t>(node)].next.emplace(c, fresh);
        node = fresh;
      } else {
        node = it->second;
      }
    }
    trie[static_cast<size_t>(node)].token = static_cast<int32_t>(index);
  }

  // BPE of one pre-token (already in the byte-level alphabet when byte_level).
  void bpe(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges) {
      auto it = vocab.find(std::string(word));
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      auto it = cache.find(std::string(word));
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    // Symbols: one per character, as a doubly linked list.
    struct Sym {
      int32_t id;
      int32_t prev, next;
      uint32_t len;  // bytes of `word` covered
    };
    std::vector<Sym> syms;
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::min(unicode::utf8_length(static_cast<unsigned char>(word[i])), word.size() - i);
      std::string ch(word.substr(i, n));
      auto it = vocab.find(ch);
      int32_t id;
      if (it != vocab.end()) {
        id = it->second;
      } else if (unk_id) {
        id = *unk_id;
      } else {
        fail("{}: the character '{}' is not in the vocabulary and the model has no unk_token", source, ch);
      }
      syms.push_back({id, static_cast<int32_t>(syms.size()) - 1, static_cast<int32_t>(syms.size()) + 1, static_cast<uint32_t>(n)});
      i += n;
    }
    syms.back().next = -1;
    // Min-heap of candidate merges (rank, left position), invalidated lazily.
    struct Cand {
      int32_t rank, pos, left_id, right_id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int32_t pos) {
      const int32_t nx = syms[static_cast<size_t>(pos)].next;
      if (nx < 0) return;
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(syms[static_cast<size_t>(pos)].id)) << 32) |
                           static_cast<uint32_t>(syms[static_cast<size_t>(nx)].id);
      auto it = merges.find(key);
      if (it != merges.end()) heap.push({it->second.first, pos, syms[static_cast<size_t>(pos)].id, syms[static_cast<size_t>(nx)].id});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      Sym& left = syms[static_cast<size_t>(c.pos)];
      if (left.len == 0 || left.id != c.left_id || left.next < 0) continue;  // stale
      Sym& right = syms[static_cast<size_t>(left.next)];
      if (right.id != c.right_id) continue;
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left.id)) << 32) | static_cast<uint32_t>(right.id);
      left.id = merges.at(key).second;
      left.len += right.len;
      right.len = 0;
      left.next = right.next;
      if (left.next >= 0) syms[static_cast<size_t>(left.next)].prev = c.pos;
      if (left.prev >= 0) push(left.prev);
      push(c.pos);
    }
    std::vector<int32_t> result;
    for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) result.push_back(syms[static_cast<size_t>(i)].id);
    out.insert(out.end(), result.begin(), result.end());
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kCacheCapacity) cache.clear();
    cache.emplace(std::string(word), std::move(result));
  }

  // Bytes of `text` that token `id` stands for (byte-level: one byte per character of its vocabulary string).
  size_t token_bytes(int32_t id) const {
    const std::string& t = id_to_token[static_cast<size_t>(id)];
    if (!byte_level) return t.size();
    size_t n = 0;
    for (unsigned char c : t) n += (c & 0xc0) != 0x80;
    return n;
  }

  // Normalize + pre-tokenize + BPE one piece of text that contains no added token. With `offsets`, appends the
  // byte range of each token, `base` being the piece's position in the input.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, size_t base = 0,
                    std::vector<std::pair<size_t, size_t>>* offsets = nullptr) const {
    std::string text = normalizers.empty() ? std::string(piece) : normalize(normalizers, std::string(piece));
    const bool exact = text == piece;
    std::vector<std::string> pieces{std::move(text)};
    bool prefix_added = false;
    for (const PreTokenizer& p : pre_tokenizers) {
      std::vector<std::string> next;
      for (std::string& s : pieces) {
        if (p.kind == PreTokenizer::ByteLevel) {
          if (p.add_prefix_space && !s.empty() && s[0] != ' ') s = " " + s, prefix_added = true;
          if (p.regex) {
            std::vector<std::string> parts;
            split_by(*p.regex, PreTokenizer::Isolated, false, s, parts);
            for (auto& part : parts) next.push_back(unicode::bytes_to_byte_level(part));
          } else {
            next.push_back(unicode::bytes_to_byte_level(s));
          }
        } else {
          split_by(*p.regex, p.kind == PreTokenizer::Digits ? PreTokenizer::Isolated : p.behavior, p.invert, s, next);
        }
      }
      pieces = std::move(next);
    }
    if (offsets == nullptr) {
      for (const std::string& s : pieces) bpe(s, out);
      return;
    }
    // Offsets: walk the tokens in order over the piece's bytes (the pre-tokenizers keep every byte, in order,
    // except Split's Removed behaviour, which we then cover coarsely).
    const size_t first = out.size();
    size_t total = 0;
    for (const std::string& s : pieces) bpe(s, out);
    for (size_t k = first; k < out.size(); ++k) total += token_bytes(out[k]);
    const bool walkable = exact && total == piece.size() + (prefix_added ? 1 : 0);
    size_t pos = 0;
    for (size_t k = first; k < out.size(); ++k) {
      if (!walkable) {
        offsets->emplace_back(base, base + piece.size());
        continue;
      }
      size_t n = token_bytes(out[k]);
      if (prefix_added && k == first) n -= std::min<size_t>(n, 1);  // the added space is not in the input
      offsets->emplace_back(base + pos, base + pos + n);
      pos += n;
    }
  }
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

namespace {

// tokenizer.json is 11 MB for Qwen3: simdjson parses it in a few milliseconds, and the small pipeline sections are
// then handed to nlohmann::json for convenient access.
nlohmann::json small_json(const simdjson::dom::element& e) { return nlohmann::json::parse(simdjson::minify(e)); }

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  Tokenizer tok;
  Impl& m = *tok.impl_;
  m.source = path;
  simdjson::padded_string text;
  if (simdjson::padded_string::load(path).get(text) != simdjson::SUCCESS) fail("{}: cannot read the file", path);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (const auto err = parser.parse(text).get(doc); err != simdjson::SUCCESS) {
    (void)parse_json(std::string_view(text.data(), text.size()), path);  // says where the error is
    fail("{}: not valid JSON ({})", path, simdjson::error_message(err));
  }
  json j = json::object();  // every top-level section except the model
  simdjson::dom::element model_el;
  if (!doc.is_object() || doc["model"].get(model_el) != simdjson::SUCCESS || !model_el.is_object()) {
    fail("{}: no 'model' object; is this a tokenizer.json?", path);
  }
  simdjson::dom::object root_obj, model_obj;
  if (doc.get_object().get(root_obj) != simdjson::SUCCESS || model_el.get_object().get(model_obj) != simdjson::SUCCESS) {
    fail("{}: expected JSON objects at the top level and in 'model'", path);
  }
  for (const auto field : root_obj) {
    if (field.key != "model") j[std::string(field.key)] = small_json(field.value);
  }
  json model = json::object();
  for (const auto field : model_obj) {
    if (field.key != "vocab" && field.key != "merges") model[std::string(field.key)] = small_json(field.value);
  }
  const std::string type = str_field(model, "type", path + ": model", "BPE");
  if (type != "BPE") fail("{}: model type '{}' is not supported (supported: BPE)", path, type);
  simdjson::dom::object vocab;
  if (model_el["vocab"].get_object().get(vocab) != simdjson::SUCCESS) fail("{}: model.vocab must be an object", path);
  m.vocab.reserve(vocab.size() * 2);
  for (const auto field : vocab) {
    int64_t id = -1;
    if (field.value.get_int64().get(id) != simdjson::SUCCESS) fail("{}: model.vocab['{}'] must be an integer id", path, field.key);
    if (id < 0 || id >= kMaxTokenId) fail("{}: model.vocab['{}'] = {} is not a valid id", path, field.key, id);
    if (static_cast<size_t>(id) >= m.id_to_token.size()) m.id_to_token.resize(static_cast<size_t>(id) + 1);
    m.id_to_token[static_cast<size_t>(id)] = std::string(field.key);
    m.vocab.emplace(std::string(field.key), static_cast<int32_t>(id));
  }
  // No merges (absent or null): every token is a whole vocabulary entry. A default simdjson array is no empty list
  // (iterating one crashed: found by the bad-input sweep), so an absent list is a parsed "[]".
  static simdjson::dom::parser empty_parser;
  static const simdjson::dom::array no_merges = empty_parser.parse(std::string_view("[]")).get_array().value();
  simdjson::dom::element merges_el;
  simdjson::dom::array merges = no_merges;
  if (model_el["merges"].get(merges_el) == simdjson::SUCCESS && !merges_el.is_null() && merges_el.get_array().get(merges) != simdjson::SUCCESS)
    fail("{}: model.merges must be a list", path);
  m.merges.reserve(merges.size() * 2);
  int32_t rank = 0;
  std::string ma, mb, mab;
  for (const auto mg : merges) {
    std::string_view sv;
    simdjson::dom::array pair;
    if (mg.get_string().get(sv) == simdjson::SUCCESS) {  // "a b"
      const size_t sp = sv.find(' ', 1);
      if (sp == std::string_view::npos) fail("{}: merge {} '{}' is not two tokens separated by a space", path, rank, sv);
      ma.assign(sv.substr(0, sp)), mb.assign(sv.substr(sp + 1));
    } else if (mg.get_array().get(pair) == simdjson::SUCCESS && pair.size() == 2 && pair.at(0).is_string() && pair.at(1).is_string()) {
      ma.assign(pair.at(0).get_string().value_unsafe()), mb.assign(pair.at(1).get_string().value_unsafe());  // ["a", "b"]
    } else {
      fail("{}: merge {} must be \"a b\" or [\"a\", \"b\"]", path, rank);
    }
    mab.assign(ma).append(mb);
    auto ia = m.vocab.find(ma), ib = m.vocab.find(mb), im = m.vocab.find(mab);
    if (ia == m.vocab.end() || ib == m.vocab.end() || im == m.vocab.end()) {
      fail("{}: merge {} ('{}' + '{}') uses a token that is not in the vocabulary", path, rank, ma, mb);
    }
    m.merges.emplace((static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second),
                     std::make_pair(rank, im->second));
    ++rank;
  }
  m.ignore_merges = bool_field(model, "ignore_merges", false);
  m.byte_fallback = bool_field(model, "byte_fallback", false);
  if (m.byte_fallback) fail("{}: byte_fallback BPE (SentencePiece-style models) is not supported yet", path);
  m.continuing_subword_prefix = str_field(model, "continuing_subword_prefix", path);
  m.end_of_word_suffix = str_field(model, "end_of_word_suffix", path);
  if (!m.continuing_subword_prefix.empty() || !m.end_of_word_suffix.empty()) {
    fail("{}: continuing_subword_prefix / end_of_word_suffix are not supported", path);
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && (!model["dropout"].is_number() || model["dropout"].get<double>() != 0.0)) {
    fail("{}: BPE dropout is not supported (it makes encoding random)", path);
  }
  const std::string unk = str_field(model, "unk_token", path);
  if (!unk.empty() && m.vocab.count(unk)) m.unk_id = m.vocab.at(unk);

  parse_normalizer(member(j, "normalizer"), m.normalizers, path + ": normalizer");
  parse_pre_tokenizer(member(j, "pre_tokenizer"), m.pre_tokenizers, path + ": pre_tokenizer");
  parse_decoder(member(j, "decoder"), m.decoders, path + ": decoder");
  parse_post_processor(member(j, "post_processor"), m.post, path + ": post_processor");
  for (const auto& p : m.pre_tokenizers) m.byte_level = m.byte_level || p.kind == PreTokenizer::ByteLevel;

  for (const json& a : list_field(j, "added_tokens", path)) {
    AddedToken t;
    if (!a.is_object()) fail("{}: added_tokens: each entry must be an object, got {}", path, json_kind(a));
    const int64_t id = int_field(a, "id", path + ": added_tokens", -1);
    if (id >= kMaxTokenId) fail("{}: added token id {} is beyond any vocabulary ({} at most)", path, id, kMaxTokenId);
    t.id = static_cast<int32_t>(std::max<int64_t>(id, -1));
    t.content = str_field(a, "content", path + ": added_tokens");
    t.special = bool_field(a, "special", false);
    t.lstrip = bool_field(a, "lstrip", false);
    t.rstrip = bool_field(a, "rstrip", false);
    t.normalized = bool_field(a, "normalized", !t.special);
    t.single_word = bool_field(a, "single_word", false);
    if (t.id < 0 || t.content.empty()) fail("{}: added token {} needs an id and a non-empty content", path, a.dump());
    if (static_cast<size_t>(t.id) >= m.id_to_token.size()) m.id_to_token.resize(static_cast<size_t>(t.id) + 1);
    m.id_to_token[static_cast<size_t>(t.id)] = t.content;
    m.added_by_id[t.id] = m.added.size();
    m.added_by_content[t.content] = t.id;
    m.added.push_back(t);
    m.add_to_trie(m.added.size() - 1);
  }
  // Ids of the single byte-level characters (for fast initial symbols).
  m.byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = m.vocab.find(unicode::byte_to_utf8()[static_cast<size_t>(b)]);
    if (it != m.vocab.end()) m.byte_ids[static_cast<size_t>(b)] = it->second;
  }
  return tok;
}

Tokenizer Tokenizer::from_pretrained(const std::string& name_or_path, const std::string& revision) {
  const std::string dir = resolve_model_dir(name_or_path, revision, "tokenizer.json");
  const fs::path file = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(file)) fail("{}: no tokenizer.json (only fast, tokenizer.json-based tokenizers are supported)", dir);
  Tokenizer tok = from_file(file.string());
  Impl& m = *tok.impl_;
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    const json cfg = parse_json(read_text_file(cfg_path.string()), cfg_path.string());
    m.eos = special_token_string(cfg, "eos_token", cfg_path.string());
    m.pad = special_token_string(cfg, "pad_token", cfg_path.string());
    m.bos = special_token_string(cfg, "bos_token", cfg_path.string());
    m.unk = special_token_string(cfg, "unk_token", cfg_path.string());
    // The tokens that end and pad sequences must be tokens of this tokenizer: one that is not would be reported later
    // as absent ("has no eos_token"), far from its cause. (Transformers would append it as a new token, an id beyond
    // the model's embeddings.)
    for (const auto& [key, text] : {std::pair<const char*, const std::string*>{"eos_token", &m.eos}, {"pad_token", &m.pad}})
      if (!text->empty() && !tok.token_to_id(*text))
        fail("{}: {} '{}' is not a token of {} (neither in the model's vocabulary nor in added_tokens); name one of its tokens, "
             "such as '<|im_end|>' for Qwen3's eos_token",
             cfg_path.string(), key, *text, file.string());
    m.cleanup = bool_field(cfg, "clean_up_tokenization_spaces", false);
    if (cfg.contains("chat_template")) {
      const json& ct = cfg["chat_template"];
      if (!ct.is_string() && !ct.is_array() && !ct.is_null())
        fail("{}: 'chat_template' must be the template's text or a list of {{\"name\", \"template\"}}, got {}", cfg_path.string(), json_kind(ct));
      if (ct.is_string()) m.chat_template = ct.get<std::string>();
      else if (ct.is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const json& t : ct)
          if (!t.is_object()) fail("{}: 'chat_template' is a list whose entries must be {{\"name\", \"template\"}} objects, got {}", cfg_path.string(), json_kind(t));
        for (const json& t : ct)
          if (str_field(t, "name", cfg_path.string() + ": chat_template") == "default") m.chat_template = str_field(t, "template", cfg_path.string() + ": chat_template");
      }
    }
  }
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";  // newer Transformers save the template separately
  if (m.chat_template.empty() && fs::exists(jinja)) m.chat_template = read_text_file(jinja.string());
  return tok;
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  std::vector<std::pair<size_t, size_t>>* none = nullptr;
  return encode_impl(input, add_special_tokens, none);
}

std::vector<int32_t> Tokenizer::encode_with_offsets(std::string_view input, bool add_special_tokens,
                                                    std::vector<std::pair<size_t, size_t>>& offsets) const {
  offsets.clear();
  std::vector<std::pair<size_t, size_t>>* p = &offsets;
  return encode_impl(input, add_special_tokens, p);
}

std::vector<int32_t> Tokenizer::encode_impl(std::string_view input, bool add_special_tokens,
                                            std::vector<std::pair<size_t, size_t>>*& offsets) const {
  const Impl& m = *impl_;
  const std::string text = unicode::sanitize_utf8(input);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  // Split on added tokens: at each position, the longest token that starts there (leftmost-longest).
  size_t piece_start = 0, i = 0;
  // single_word tokens match only between non-word characters (word = alphanumeric or '_', as in `tokenizers`).
  auto is_word_char = [&](size_t pos, bool before) {
    size_t t = pos;
    if (before) {
      if (pos == 0) return false;
      t = pos - 1;
      while (t > 0 && (static_cast<unsigned char>(text[t]) & 0xc0) == 0x80) --t;
    } else if (pos >= text.size()) {
      return false;
    }
    const char32_t c = unicode::next_code_point(text, t);
    return c == '_' || unicode::is_alphanumeric(c);
  };
  while (i < text.size()) {
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < text.size(); ++k) {
      auto it = m.trie[static_cast<size_t>(node)].next.find(static_cast<unsigned char>(text[k]));
      if (it == m.trie[static_cast<size_t>(node)].next.end()) break;
      node = it->second;
      if (m.trie[static_cast<size_t>(node)].token >= 0) best = m.trie[static_cast<size_t>(node)].token, best_end = k + 1;
    }
    if (best >= 0) {
      const AddedToken& t = m.added[static_cast<size_t>(best)];
      if (t.single_word && (is_word_char(i, true) || is_word_char(best_end, false))) best = -1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = m.added[static_cast<size_t>(best)];
    size_t left = i, right = best_end;
    if (t.lstrip) {
      while (left > piece_start) {
        size_t k = left - 1;
        while (k > piece_start && (static_cast<unsigned char>(text[k]) & 0xc0) == 0x80) --k;
        size_t tt = k;
        if (!is_ws(unicode::next_code_point(text, tt))) break;
        left = k;
      }
    }
    if (t.rstrip) {
      while (right < text.size()) {
        size_t tt = right;
        if (!is_ws(unicode::next_code_point(text, tt))) break;
        right = tt;
      }
    }
    if (left > piece_start) m.encode_piece(std::string_view(text).substr(piece_start, left - piece_start), ids, piece_start, offsets);
    ids.push_back(t.id);
    if (offsets) offsets->emplace_back(i, best_end);
    piece_start = i = right;
  }
  if (piece_start < text.size()) m.encode_piece(std::string_view(text).substr(piece_start), ids, piece_start, offsets);
  if (add_special_tokens && m.post.template_processing) {
    std::vector<int32_t> out;
    std::vector<std::pair<size_t, size_t>> out_offsets;
    for (const TemplatePiece& p : m.post.single) {
      if (p.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
        if (offsets) out_offsets.insert(out_offsets.end(), offsets->begin(), offsets->end());
      } else {
        out.insert(out.end(), p.special.begin(), p.special.end());
        if (offsets) out_offsets.insert(out_offsets.end(), p.special.size(), {0, 0});
      }
    }
    if (offsets) *offsets = std::move(out_offsets);
    return out;
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= m.id_to_token.size() || m.id_to_token[static_cast<size_t>(id)].empty()) continue;
    if (skip_special_tokens && is_special(id)) continue;
    tokens.push_back(m.id_to_token[static_cast<size_t>(id)]);
  }
  for (const Decoder& d : m.decoders) {
    switch (d.kind) {
      case Decoder::ByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string mapped;
          bool ok = true;
          for (size_t i = 0; i < t.size() && ok;) {
            const int b = unicode::code_point_to_byte(unicode::next_code_point(t, i));
            if (b < 0) ok = false;
            else mapped.push_back(static_cast<char>(b));
          }
          bytes += ok ? mapped : t;
        }
        tokens = {unicode::sanitize_utf8(bytes)};
        break;
      }
      case Decoder::Fuse: {
        std::string all;
        for (auto& t : tokens) all += t;
        tokens = {all};
        break;
      }
      case Decoder::Replace:
        for (auto& t : tokens) t = replace_all(*d.pattern, t, d.content);
        break;
      case Decoder::Strip:
        for (auto& t : tokens) {
          size_t b = 0, e = t.size();
          for (size_t k = 0; k < d.strip_start && b < e && t.compare(b, d.strip_char.size(), d.strip_char) == 0; ++k) b += d.strip_char.size();
          for (size_t k = 0; k < d.strip_stop && e > b + d.strip_char.size() - 1 &&
                             t.compare(e - d.strip_char.size(), d.strip_char.size(), d.strip_char) == 0;
               ++k)
            e -= d.strip_char.size();
          t = t.substr(b, e - b);
        }
        break;
    }
  }
  std::string text;
  for (const auto& t : tokens) text += t;
  if (m.decoders.empty()) text = unicode::sanitize_utf8(text);
  if (m.cleanup) {
    // Transformers' clean_up_tokenization: remove the space before punctuation and in English contractions.
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}}) {
      for (size_t p = text.find(from); p != std::string::npos; p = text.find(from, p + to.size())) text.replace(p, from.size(), to);
    }
  }
  return text;
}

BatchEncoding Tokenizer::operator()(const std::vector<std::string>& texts, const TokenizeOptions& o) const {
  std::vector<std::vector<int32_t>> rows;
  rows.reserve(texts.size());
  for (const std::string& t : texts) rows.push_back(encode(t, o.add_special_tokens));
  return pad(std::move(rows), o);
}

BatchEncoding Tokenizer::pad(std::vector<std::vector<int32_t>> rows, const TokenizeOptions& o) const {
  std::string padding = o.padding;
  if (padding == "true") padding = "longest";
  if (padding == "false") padding = "do_not_pad";
  if (padding != "longest" && padding != "max_length" && padding != "do_not_pad") {
    fail("padding='{}' is not valid (use longest, max_length or do_not_pad)", o.padding);
  }
  if (o.padding_side != "right" && o.padding_side != "left") fail("padding_side='{}' is not valid (use right or left)", o.padding_side);
  if (o.truncation_side != "right" && o.truncation_side != "left") fail("truncation_side='{}' is not valid (use right or left)", o.truncation_side);
  if ((padding == "max_length" || o.truncation) && !o.max_length) fail("padding='max_length' and truncation need max_length");
  if (o.max_length && *o.max_length < 0) fail("max_length must not be negative");
  if (o.pad_to_multiple_of && *o.pad_to_multiple_of <= 0) fail("pad_to_multiple_of must be positive");
  if (o.truncation) {
    const size_t n = static_cast<size_t>(*o.max_length);
    for (auto& r : rows) {
      if (r.size() <= n) continue;
      if (o.truncation_side == "right") r.resize(n);
      else r.erase(r.begin(), r.end() - static_cast<std::ptrdiff_t>(n));
    }
  }
  BatchEncoding out;
  size_t target = 0;
  for (const auto& r : rows) target = std::max(target, r.size());
  if (padding == "max_length") target = std::max(target, static_cast<size_t>(*o.max_length));
  if (padding != "do_not_pad" && o.pad_to_multiple_of) {
    const size_t k = static_cast<size_t>(*o.pad_to_multiple_of);
    target = (target + k - 1) / k * k;
  }
  const auto pad_id = pad_token_id();
  for (auto& r : rows) {
    std::vector<int32_t> mask(r.size(), 1);
    if (padding != "do_not_pad" && r.size() < target) {
      if (!pad_id) fail("padding needs a pad token: tokenizer_config.json has neither pad_token nor eos_token");
      const size_t n = target - r.size();
      if (o.padding_side == "right") {
        r.insert(r.end(), n, *pad_id);
        mask.insert(mask.end(), n, 0);
      } else {
        r.insert(r.begin(), n, *pad_id);
        mask.insert(mask.begin(), n, 0);
      }
    }
    out.input_ids.push_back(std::move(r));
    out.attention_mask.push_back(std::move(mask));
  }
  return out;
}

static Tensor rows_to_tensor(const std::vector<std::vector<int32_t>>& rows, const char* what) {
  const int64_t B = static_cast<int64_t>(rows.size());
  const int64_t T = B ? static_cast<int64_t>(rows[0].size()) : 0;
  Tensor t = Tensor::zeros(DType::I32, {B, T});
  for (int64_t b = 0; b < B; ++b) {
    if (static_cast<int64_t>(rows[static_cast<size_t>(b)].size()) != T) fail("{}: rows have different lengths; pad them first", what);
    std::copy(rows[static_cast<size_t>(b)].begin(), rows[static_cast<size_t>(b)].end(), t.mutable_data_as<int32_t>() + b * T);
  }
  return t;
}

Tensor BatchEncoding::input_ids_tensor() const { return rows_to_tensor(input_ids, "input_ids"); }
Tensor BatchEncoding::attention_mask_tensor() const { return rows_to_tensor(attention_mask, "attention_mask"); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size()) return "";
  return impl_->id_to_token[static_cast<size_t>(id)];
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->vocab.size() + impl_->added.size()); }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}
const std::string& Tokenizer::eos_token() const { return impl_->eos; }
const std::string& Tokenizer::pad_token() const { return impl_->pad; }
const std::string& Tokenizer::bos_token() const { return impl_->bos; }
const std::string& Tokenizer::unk_token() const { return impl_->unk; }
std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos.empty() ? std::nullopt : token_to_id(impl_->eos); }
std::optional<int32_t> Tokenizer::pad_token_id() const {
  if (!impl_->pad.empty()) return token_to_id(impl_->pad);
  return eos_token_id();
}
std::optional<int32_t> Tokenizer::bos_token_id() const { return impl_->bos.empty() ? std::nullopt : token_to_id(impl_->bos); }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
bool Tokenizer::clean_up_tokenization_spaces() const { return impl_->cleanup; }

}  // namespace trl

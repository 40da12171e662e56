#include "tokenizer/unicode.h"

#include <cstdlib>
#include <memory>
#include <vector>

#include <utf8proc.h>

#include "trl/core/error.h"

namespace trl::unicode {

size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xe) return 3;
  if ((c >> 3) == 0x1e) return 4;
  return 1;
}

namespace {

// Length of the well-formed sequence at s[i], or 0 with `bad` = length of the maximal subpart to replace.
size_t valid_sequence(std::string_view s, size_t i, size_t& bad) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  bad = 1;
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c == 0xe0) n = 3, lo = 0xa0;
  else if (c >= 0xe1 && c <= 0xec) n = 3;
  else if (c == 0xed) n = 3, hi = 0x9f;
  else if (c >= 0xee && c <= 0xef) n = 3;
  else if (c == 0xf0) n = 4, lo = 0x90;
  else if (c >= 0xf1 && c <= 0xf3) n = 4;
  else if (c == 0xf4) n = 4, hi = 0x8f;
  else return 0;
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char t = b(i + k);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
    if (t < l || t > h) return 0;
    bad = k + 1;
  }
  return n;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t bad;
    size_t n = valid_sequence(s, i, bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    size_t bad;
    size_t n = valid_sequence(s, i, bad);
    if (n == 0) {
      out += "\xef\xbf\xbd";
      // `bad` counts the lead plus the continuation bytes that were still acceptable: the maximal subpart.
      i += bad;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t n = utf8_length(c);
  char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

namespace {

std::string utf8proc_map_string(std::string_view s, int options, const char* what) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii && !(options & UTF8PROC_CASEFOLD)) return std::string(s);  // ASCII is invariant under every form
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (n < 0) fail("{} normalisation failed: {}", what, utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

}  // namespace

std::string nfc(std::string_view s) { return utf8proc_map_string(s, UTF8PROC_COMPOSE, "NFC"); }
std::string nfd(std::string_view s) { return utf8proc_map_string(s, UTF8PROC_DECOMPOSE, "NFD"); }
std::string nfkc(std::string_view s) { return utf8proc_map_string(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, "NFKC"); }
std::string nfkd(std::string_view s) { return utf8proc_map_string(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, "NFKD"); }

bool is_alphanumeric(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

namespace {
bool is_cased(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}
bool is_case_ignorable(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_LM ||
         c == UTF8PROC_CATEGORY_SK || cp == '\'' || cp == '.' || cp == ':' || cp == 0x2019;
}
}  // namespace

// Full lowercase mapping, as Rust's str::to_lowercase (which `tokenizers` uses): simple mappings plus the
// unconditional special case U+0130 -> "i\u0307" and the contextual Greek final sigma.
std::string lowercase(std::string_view s) {
  std::vector<char32_t> cps;
  for (size_t i = 0; i < s.size();) cps.push_back(next_code_point(s, i));
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < cps.size(); ++k) {
    const char32_t cp = cps[k];
    if (cp == 0x130) {
      out += "i\xcc\x87";
    } else if (cp == 0x3a3) {
      // Final_Sigma: preceded by a cased letter and not followed by one (skipping case-ignorable characters).
      bool before = false, after = false;
      for (size_t j = k; j-- > 0;) {
        if (is_case_ignorable(cps[j])) continue;
        before = is_cased(cps[j]);
        break;
      }
      for (size_t j = k + 1; j < cps.size(); ++j) {
        if (is_case_ignorable(cps[j])) continue;
        after = is_cased(cps[j]);
        break;
      }
      append_utf8(out, before && !after ? 0x3c2 : 0x3c3);
    } else {
      append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
    }
  }
  return out;
}

const std::array<std::string, 256>& byte_to_utf8() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      append_utf8(t[static_cast<size_t>(b)], keep ? static_cast<char32_t>(b) : next++);
    }
    return t;
  }();
  return table;
}

int code_point_to_byte(char32_t cp) {
  static const std::array<int, 512> reverse = [] {
    std::array<int, 512> r;
    r.fill(-1);
    const auto& t = byte_to_utf8();
    for (int b = 0; b < 256; ++b) {
      size_t i = 0;
      r[next_code_point(t[static_cast<size_t>(b)], i)] = b;
    }
    return r;
  }();
  return cp < 512 ? reverse[cp] : -1;
}

std::string bytes_to_byte_level(std::string_view s) {
  const auto& t = byte_to_utf8();
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) out += t[static_cast<unsigned char>(c)];
  return out;
}

}  // namespace trl::unicode

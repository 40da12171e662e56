// UTF-8 helpers for the tokenizer: validation with replacement, code point iteration, Unicode normalisation
// (utf8proc) and the GPT-2 byte-level alphabet.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trl::unicode {

// Replaces every ill-formed UTF-8 subsequence with U+FFFD, one per maximal subpart (the Unicode / WHATWG policy
// used by Python's errors="replace", Rust's from_utf8_lossy and JavaScript's TextDecoder). Valid input is
// returned unchanged.
std::string sanitize_utf8(std::string_view s);
bool is_valid_utf8(std::string_view s);

// Decodes one code point at s[i] (s must be valid UTF-8) and advances i.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
size_t utf8_length(unsigned char lead);  // bytes in the sequence that starts with `lead` (1 for invalid leads)

// Unicode normalisation forms (utf8proc). Input must be valid UTF-8.
std::string nfc(std::string_view s);
std::string nfd(std::string_view s);
std::string nfkc(std::string_view s);
std::string nfkd(std::string_view s);
std::string lowercase(std::string_view s);  // full mapping, as Rust's str::to_lowercase
bool is_alphanumeric(char32_t cp);           // letters and numbers (Rust's char::is_alphanumeric, approximately)

// GPT-2's bytes_to_unicode: bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to the same code point, the other 68 bytes
// to U+0100, U+0101, ... in order. byte_to_utf8()[b] is that code point in UTF-8.
const std::array<std::string, 256>& byte_to_utf8();
// The reverse map; returns -1 for a code point outside the alphabet.
int code_point_to_byte(char32_t cp);
// Maps every byte of s to its byte-level character.
std::string bytes_to_byte_level(std::string_view s);

}  // namespace trl::unicode

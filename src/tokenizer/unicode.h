// UTF-8 helpers for the tokenizers: well-formedness, replacement of ill-formed input,
// NFC normalization and GPT-2's byte-to-unicode alphabet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kivi::tok {

// Replaces every ill-formed subsequence by U+FFFD, one per maximal subpart (Unicode
// 15.0 section 3.9 "U+FFFD Substitution of Maximal Subparts", which the WHATWG
// Encoding Standard, node's TextDecoder and Python's errors="replace" follow):
// "\xE2\x82" (a truncated 3-byte sequence) becomes one U+FFFD, "\xC0\xAF" two.
std::string utf8_sanitize(std::string_view s);
bool utf8_is_valid(std::string_view s);

// Length of the well-formed sequence starting at s[i], or 0 if none starts there.
size_t utf8_sequence_length(std::string_view s, size_t i);

// Number of bytes at the end of `s` that are a proper prefix of a well-formed sequence
// (0 to 3): what a streaming decoder holds back until the next token completes it.
size_t utf8_incomplete_tail(std::string_view s);

// Decodes the code point at s[i] (which must start a well-formed sequence) and advances i.
uint32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, uint32_t cp);

// Unicode Normalization Form C of well-formed UTF-8 (ICU). ASCII returns unchanged
// without a copy through ICU.
std::string utf8_nfc(std::string_view s);

// GPT-2's byte-level alphabet (openai/gpt-2 encoder.py, bytes_to_unicode): the bytes
// '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves, the other 68 bytes (controls,
// space, 0x7F..0xA0, 0xAD) map in order to U+0100..U+0143, so every byte is one printable
// character. byte_to_unicode returns that character's UTF-8.
const std::string& byte_to_unicode(uint8_t b);
// The byte a code point of the alphabet stands for, or -1.
int unicode_to_byte(uint32_t cp);
// Bytes of a whole byte-level string; characters outside the alphabet are kept as their
// UTF-8 (so a malformed vocabulary degrades to text instead of failing).
std::string byte_level_decode(std::string_view s);
std::string byte_level_encode(std::string_view bytes);

}  // namespace kivi::tok

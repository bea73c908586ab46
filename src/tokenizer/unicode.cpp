#include "tokenizer/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <array>

#include "core/error.h"

namespace kivi::tok {

namespace {

// Expected continuation-byte count and the allowed range of the first continuation
// byte for a lead byte (Unicode table 3-7, Well-Formed UTF-8 Byte Sequences).
struct Lead {
  int need;  // -1: not a lead byte
  uint8_t lo, hi;
};

Lead lead_of(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {-1, 0, 0};
}

// Bytes of the longest prefix of a well-formed sequence at s[i] (at least 1 when a
// lead byte is valid), and whether it is complete.
size_t valid_prefix(std::string_view s, size_t i, bool* complete) {
  const Lead l = lead_of(static_cast<uint8_t>(s[i]));
  *complete = false;
  if (l.need < 0) return 0;
  size_t k = 1;
  for (; k <= static_cast<size_t>(l.need); ++k) {
    if (i + k >= s.size()) return k;
    const uint8_t c = static_cast<uint8_t>(s[i + k]);
    const uint8_t lo = k == 1 ? l.lo : 0x80, hi = k == 1 ? l.hi : 0xBF;
    if (c < lo || c > hi) return k;
  }
  *complete = true;
  return k;
}

constexpr const char* kReplacement = "\xEF\xBF\xBD";

struct ByteAlphabet {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 324> to_byte;  // code points 0..323 cover the whole alphabet
  ByteAlphabet() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool self =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = self ? static_cast<uint32_t>(b) : 256u + n++;
      utf8_append(to_unicode[b], cp);
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t i) {
  bool complete = false;
  const size_t n = valid_prefix(s, i, &complete);
  return complete ? n : 0;
}

bool utf8_is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    bool complete = false;
    const size_t n = valid_prefix(s, i, &complete);
    if (complete) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += kReplacement;
      i += n > 0 ? n : 1;  // a maximal subpart, or one byte that starts nothing
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const uint8_t b = static_cast<uint8_t>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // continuation: look further back
    bool complete = false;
    const size_t p = valid_prefix(s, i, &complete);
    return !complete && p == back ? back : 0;
  }
  return 0;
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  const uint8_t b = static_cast<uint8_t>(s[i]);
  const int need = lead_of(b).need;
  if (need <= 0) {
    ++i;
    return b;
  }
  uint32_t cp = b & (0x3F >> need);
  for (int k = 1; k <= need; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += need + 1;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_nfc(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) fail("Unicode NFC normalizer unavailable (ICU: %s)", u_errorName(status));
  const icu::UnicodeString in =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (nfc->isNormalized(in, status) && U_SUCCESS(status)) return std::string(s);
  status = U_ZERO_ERROR;
  const icu::UnicodeString norm = nfc->normalize(in, status);
  if (U_FAILURE(status)) fail("Unicode NFC normalization failed (ICU: %s)", u_errorName(status));
  std::string out;
  norm.toUTF8String(out);
  return out;
}

const std::string& byte_to_unicode(uint8_t b) { return alphabet().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) {
  return cp < alphabet().to_byte.size() ? alphabet().to_byte[cp] : -1;
}

std::string byte_level_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    if (utf8_sequence_length(s, i) == 0) {
      out += s[i++];  // not UTF-8: keep the byte
      continue;
    }
    const int b = unicode_to_byte(utf8_next(s, i));
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_to_unicode(static_cast<uint8_t>(c));
  return out;
}

}  // namespace kivi::tok

// The parts of the JSON-schema converter (json_schema.cpp) that do not depend on the
// schema's JSON type: the rules every grammar shares, the keyword tables, rule names,
// GBNF literals and the digit-range grammars of bounded integers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kivi::grammar::schema_rules {

constexpr int kMaxDepth = 64;                      // schemas nested deeper are refused
constexpr int64_t kMaxCount = 10000;               // largest minItems, maxLength, ...
constexpr size_t kMaxGrammarBytes = 1u << 20;      // grammar text plus repetition cost
constexpr size_t kRepeatCost = 4;                  // bytes charged per bounded repetition
constexpr int64_t kIntCap = 9999999999999999;      // 16 digits: an unbounded integer part
constexpr int64_t kBoundCap = 999999999999999999;  // 18 digits: the widest bounded one
constexpr int64_t kHuge = 2000000000000000000;     // bounds beyond this are clamped to it

// Rules shared by every grammar, added when first used (with their dependencies).
// Whitespace between tokens is bounded (one space, or a newline and up to 20 spaces or
// tabs) so that generation always ends. `char` is one JSON string character: anything
// but a quote, a backslash, a control character or a lone surrogate, or an escape (a
// \u surrogate only as a high-low pair, which counts as one character). Numbers have at
// most 16 integer and 16 fraction digits and a 2-digit exponent, so every one is a
// finite double.
struct Primitive {
  const char* body;
  std::vector<const char*> deps;
};

// The string formats and the range of their lengths in characters.
struct Format {
  const char* name;
  int64_t min_len, max_len;
};
inline constexpr Format kFormats[] = {
    {"date", 10, 10}, {"time", 9, 24}, {"date-time", 20, 35}, {"uuid", 36, 36}, {"ipv4", 7, 15},
};

inline const char* const kTypes[] = {"object",  "array",   "string", "number",
                                     "integer", "boolean", "null"};

const std::map<std::string, Primitive>& primitives();

// The words of a space-separated list.
std::set<std::string> words(const std::string& list);

// The keywords that imply a type when "type" is absent (the grammar then emits only
// values of that type, which is stricter than the schema and so still valid).
const std::map<std::string, std::vector<std::string>>& implied_types();

// A JSON pointer segment: '~' and '/' escaped (RFC 6901).
std::string escape_pointer(const std::string& key);

// Whether a name ends like the parser's generated rules ("name-12").
bool ends_with_number(const std::string& s);

// A rule name from a hint: letters, digits and dashes, at most 60 characters, never
// ending in "-<digits>" (the parser names the rules it generates that way).
std::string sanitize_name(const std::string& hint);

// A child rule's name: the parent's and the segment's, joined with a dash.
std::string join_name(const std::string& parent, const std::string& segment);

// A GBNF literal for UTF-8 text: quotes, backslashes and control characters escaped,
// everything past ASCII as \u or \U escapes.
std::string gbnf_literal(std::string_view s, const std::string& ptr);

// Postfix for `lo` to `hi` repetitions (hi < 0: unbounded).
std::string repeat_suffix(int64_t lo, int64_t hi);

// Alternatives as one element: grouped when there are several.
std::string group(const std::vector<std::string>& alts);

// Digit strings of one length between a and b inclusive (a <= b; leading zeros are
// part of the strings). The classic construction: split on the first digit where the
// bounds differ.
std::string same_length_range(const std::string& a, const std::string& b);

// Decimal integers in [a, b] (0 <= a <= b) without leading zeros, as a GBNF expression.
std::string integer_range(int64_t a, int64_t b);

// Numbers m >= 0 (integer part and optional fraction) with lo <= m (lo < m when
// lo_strict) and m <= hi (m < hi when hi_strict) if has_hi, else integer part <= cap.
// With integer bounds the integer part i and whether the fraction is zero decide.
void magnitude_pieces(int64_t lo, bool lo_strict, bool has_hi, int64_t hi, bool hi_strict,
                      int64_t cap, const std::string& sign, std::vector<std::string>& alts);

// Validation keywords this converter does not implement.
extern const std::set<std::string> kUnsupported;

// The validation keywords handled here; any of them beside $ref, anyOf, allOf or enum
// changes what those mean, and the combination is refused.
extern const std::set<std::string> kHandled;

extern const char* const kFracAny;      // an optional fraction
extern const char* const kFracZero;     // an optional fraction of zeros
extern const char* const kFracNonZero;  // a fraction that is not zero

// The nesting depth of a JSON value, counted up to `limit` + 1.
template <class Json>
int value_depth(const Json& j, int limit) {
  if (!j.is_structured()) return 0;
  if (limit < 0) return 1;
  int d = 0;
  for (const auto& v : j) d = std::max(d, value_depth(v, limit - 1));
  return d + 1;
}

// Restores a flag when a scope ends.
class FlagScope {
 public:
  FlagScope(bool& flag, bool value) : flag_(flag), saved_(flag) { flag_ = value; }
  ~FlagScope() { flag_ = saved_; }

 private:
  bool& flag_;
  bool saved_;
};

}  // namespace kivi::grammar::schema_rules

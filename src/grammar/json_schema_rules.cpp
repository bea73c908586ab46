#include "grammar/json_schema_rules.h"

#include "grammar/json_schema.h"

namespace kivi::grammar::schema_rules {

const std::map<std::string, Primitive>& primitives() {
  static const std::map<std::string, Primitive> table = {
      {"space", {R"g(( " " | "\n" [ \t]{0,20} )?)g", {}}},
      {"boolean", {R"g(("true" | "false") space)g", {"space"}}},
      {"null", {R"g("null" space)g", {"space"}}},
      {"char",
       {R"g([^"\\\x00-\x1F\uD800-\uDFFF] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2})))g",
        {}}},
      {"string", {R"g("\"" char* "\"" space)g", {"char", "space"}}},
      {"integer", {R"g("-"? ("0" | [1-9] [0-9]{0,15}) space)g", {"space"}}},
      {"number",
       {R"g("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})? space)g",
        {"space"}}},
      {"value",
       {"object | array | string | number | boolean | null",
        {"object", "array", "string", "number", "boolean", "null"}}},
      {"object",
       {R"g("{" space (string ":" space value ("," space string ":" space value)*)? "}" space)g",
        {"space", "string", "value"}}},
      {"array", {R"g("[" space (value ("," space value)*)? "]" space)g", {"space", "value"}}},
      // RFC 3339 full-date with the days of each month; years 1000-9999 (year 0000 is
      // refused by some validators). February 29 only in leap years: the last two digits
      // a non-zero multiple of 4, or "00" after a multiple of 4.
      {"date",
       {R"g([1-9] [0-9]{3} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])) | leap-year "-02-29")g",
        {"leap-year"}}},
      {"leap-year",
       {R"g([1-9] [0-9] ([02468] [48] | [13579] [26] | [2468] "0") | ([2468] [048] | [13579] [26]) "00")g",
        {}}},
      // RFC 3339 full-time: an offset is required; no leap second.
      {"time",
       {R"g(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? ("Z" | [-+] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))g",
        {}}},
      {"hex", {"[0-9a-fA-F]", {}}},
      {"date-string", {R"g("\"" date "\"" space)g", {"date", "space"}}},
      {"time-string", {R"g("\"" time "\"" space)g", {"time", "space"}}},
      {"date-time-string", {R"g("\"" date "T" time "\"" space)g", {"date", "time", "space"}}},
      {"uuid-string",
       {R"g("\"" hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12} "\"" space)g",
        {"hex", "space"}}},
      {"ipv4-octet",
       {R"g("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])g", {}}},
      {"ipv4-string",
       {R"g("\"" ipv4-octet ("." ipv4-octet){3} "\"" space)g", {"ipv4-octet", "space"}}},
  };
  return table;
}

// The words of a space-separated list.
std::set<std::string> words(const std::string& list) {
  std::set<std::string> out;
  for (size_t i = 0, j; i < list.size(); i = j + 1) {
    j = std::min(list.find(' ', i), list.size());
    out.insert(list.substr(i, j - i));
  }
  return out;
}

// Validation keywords this converter does not implement.
const std::set<std::string> kUnsupported = words(
    "oneOf not if then else dependentSchemas dependentRequired dependencies patternProperties "
    "propertyNames unevaluatedItems unevaluatedProperties contains minContains maxContains "
    "multipleOf pattern $dynamicRef $recursiveRef");

// The validation keywords handled here; any of them beside $ref, anyOf, allOf or enum
// changes what those mean, and the combination is refused.
const std::set<std::string> kHandled = words(
    "type enum const anyOf allOf $ref properties required additionalProperties minProperties "
    "maxProperties items prefixItems additionalItems minItems maxItems uniqueItems minLength "
    "maxLength format minimum maximum exclusiveMinimum exclusiveMaximum");

// The keywords that imply a type when "type" is absent (the grammar then emits only
// values of that type, which is stricter than the schema and so still valid).
const std::map<std::string, std::vector<std::string>>& implied_types() {
  static const std::map<std::string, std::vector<std::string>> table = {
      {"object",
       {"properties", "required", "additionalProperties", "minProperties", "maxProperties"}},
      {"array", {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"}},
      {"string", {"minLength", "maxLength", "format"}},
      {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}},
  };
  return table;
}

// A JSON pointer segment: '~' and '/' escaped (RFC 6901).
std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

// Whether a name ends like the parser's generated rules ("name-12").
bool ends_with_number(const std::string& s) {
  size_t i = s.size();
  while (i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9') --i;
  return i < s.size() && (i == 0 || s[i - 1] == '-');
}

// A rule name from a hint: letters, digits and dashes, at most 60 characters, never
// ending in "-<digits>" (the parser names the rules it generates that way).
std::string sanitize_name(const std::string& hint) {
  std::string out;
  for (char c : hint) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    out += ok ? c : '-';
    if (out.size() >= 60) break;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  if (out.empty()) out = "x";
  if (ends_with_number(out)) out += "x";
  return out;
}

std::string join_name(const std::string& parent, const std::string& segment) {
  return parent + "-" + segment;
}

// A GBNF literal for UTF-8 text: quotes, backslashes and control characters escaped,
// everything past ASCII as \u or \U escapes.
std::string gbnf_literal(std::string_view s, const std::string& ptr) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      const char* esc = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : nullptr;
      if (esc) {
        out += esc;
      } else if (c < 0x20 || c == 0x7F) {
        out += strfmt("\\x%02X", c);
      } else {
        if (c == '"' || c == '\\') out += '\\';
        out += static_cast<char>(c);
      }
      continue;
    }
    const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || i + len > s.size()) throw SchemaError("invalid UTF-8 in a string", ptr);
    uint32_t cp = c & (0x3F >> (len - 1));
    for (int k = 1; k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) throw SchemaError("invalid UTF-8 in a string", ptr);
      cp = (cp << 6) | (d & 0x3F);
    }
    i += len;
    out += cp > 0xFFFF ? strfmt("\\U%08X", cp) : strfmt("\\u%04X", cp);
  }
  return out + "\"";
}

// Postfix for `lo` to `hi` repetitions (hi < 0: unbounded).
std::string repeat_suffix(int64_t lo, int64_t hi) {
  if (hi < 0) {
    if (lo == 0) return "*";
    if (lo == 1) return "+";
    return "{" + std::to_string(lo) + ",}";
  }
  if (lo == 0 && hi == 1) return "?";
  if (lo == hi) return lo == 1 ? "" : "{" + std::to_string(lo) + "}";
  return "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
}

// Alternatives as one element: grouped when there are several.
std::string group(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

// Digit strings of one length between a and b inclusive (a <= b; leading zeros are
// part of the strings). The classic construction: split on the first digit where the
// bounds differ.
std::string same_length_range(const std::string& a, const std::string& b) {
  if (a.empty()) return "";
  if (a == b) return "\"" + a + "\"";
  if (a[0] == b[0]) {
    return "\"" + a.substr(0, 1) + "\" " + same_length_range(a.substr(1), b.substr(1));
  }
  const size_t rest = a.size() - 1;
  const std::string ra = a.substr(1), rb = b.substr(1);
  const bool low_full = ra.find_first_not_of('0') == std::string::npos;
  const bool high_full = rb.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> alts;
  char mid_lo = a[0], mid_hi = b[0];
  if (!low_full) {
    alts.push_back("\"" + a.substr(0, 1) + "\" " + same_length_range(ra, std::string(rest, '9')));
    ++mid_lo;
  }
  if (!high_full) --mid_hi;
  if (mid_lo <= mid_hi) {
    std::string m = std::string("[") + mid_lo + "-" + mid_hi + "]";
    if (rest > 0) m += " [0-9]" + repeat_suffix(rest, rest);
    alts.push_back(m);
  }
  if (!high_full) {
    alts.push_back("\"" + b.substr(0, 1) + "\" " + same_length_range(std::string(rest, '0'), rb));
  }
  return group(alts);
}

// Decimal integers in [a, b] (0 <= a <= b) without leading zeros, as a GBNF expression.
std::string integer_range(int64_t a, int64_t b) {
  std::vector<std::string> alts;
  if (a == 0) {
    alts.push_back("\"0\"");
    if (b == 0) return alts[0];
    a = 1;
  }
  const std::string sa = std::to_string(a), sb = std::to_string(b);
  if (sa.size() == sb.size()) {
    alts.push_back(same_length_range(sa, sb));
  } else {
    // Whole lengths (every number of that many digits) in the middle become one
    // [1-9] [0-9]{m,n}; partial first and last lengths get their own ranges.
    size_t full_lo = sa.size() + 1, full_hi = sb.size() - 1;
    if (sa[0] == '1' && sa.find_first_not_of('0', 1) == std::string::npos) {
      full_lo = sa.size();
    } else {
      alts.push_back(same_length_range(sa, std::string(sa.size(), '9')));
    }
    const bool b_full = sb.find_first_not_of('9') == std::string::npos;
    if (b_full) full_hi = sb.size();
    if (full_lo <= full_hi) {
      std::string m = "[1-9]";
      if (full_hi > 1) m += " [0-9]" + repeat_suffix(full_lo - 1, full_hi - 1);
      alts.push_back(m);
    }
    if (!b_full) alts.push_back(same_length_range("1" + std::string(sb.size() - 1, '0'), sb));
  }
  return group(alts);
}

extern const char* const kFracAny = "(\".\" [0-9]{1,16})?";
extern const char* const kFracZero = "(\".\" [0]{1,16})?";
extern const char* const kFracNonZero = "\".\" [0]{0,7} [1-9] [0-9]{0,8}";  // at most 16 digits

// Numbers m >= 0 (integer part and optional fraction) with lo <= m (lo < m when
// lo_strict) and m <= hi (m < hi when hi_strict) if has_hi, else integer part <= cap.
// With integer bounds the integer part i and whether the fraction is zero decide.
void magnitude_pieces(int64_t lo, bool lo_strict, bool has_hi, int64_t hi, bool hi_strict,
                      int64_t cap, const std::string& sign, std::vector<std::string>& alts) {
  const int64_t any_lo = lo_strict ? lo + 1 : lo;
  const int64_t any_hi = has_hi ? hi - 1 : cap;
  if (any_lo <= any_hi) alts.push_back(sign + integer_range(any_lo, any_hi) + " " + kFracAny);
  if (lo_strict && (has_hi ? lo < hi : lo <= cap)) {
    alts.push_back(sign + "\"" + std::to_string(lo) + "\" " + kFracNonZero);
  }
  if (has_hi && !hi_strict && (lo_strict ? hi > lo : hi >= lo)) {
    alts.push_back(sign + "\"" + std::to_string(hi) + "\" " + kFracZero);
  }
}

}  // namespace kivi::grammar::schema_rules

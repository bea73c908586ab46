#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kivi::grammar {

SchemaError::SchemaError(const std::string& message, std::string pointer)
    : Error(pointer.empty() ? "json schema: " + message
                            : "json schema at " + pointer + ": " + message),
      pointer_(std::move(pointer)) {}

namespace {

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

// The string formats and the range of their lengths in characters.
struct Format {
  const char* name;
  int64_t min_len, max_len;
};
constexpr Format kFormats[] = {
    {"date", 10, 10}, {"time", 9, 24}, {"date-time", 20, 35}, {"uuid", 36, 36}, {"ipv4", 7, 15},
};

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

const char* const kTypes[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

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

const char* const kFracAny = "(\".\" [0-9]{1,16})?";
const char* const kFracZero = "(\".\" [0]{1,16})?";
const char* const kFracNonZero = "\".\" [0]{0,7} [1-9] [0-9]{0,8}";  // at most 16 digits

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

template <class Json>
class Converter {
 public:
  explicit Converter(const Json& root) : root_(root) {
    for (const auto& p : primitives()) taken_.insert(p.first);
    taken_.insert("root");
  }

  std::string run() {
    refs_[""] = "root";
    slot("root");
    current_ = "root";
    at_head_ = true;
    set_rule("root", visit(root_, "", 0, "root"));
    while (!todo_.empty()) {
      const Pending p = todo_.front();
      todo_.pop_front();
      current_ = p.name;
      at_head_ = true;
      set_rule(p.name, visit(*p.schema, p.pointer, p.depth, p.name));
    }
    check_ref_cycles();
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  struct Pending {
    const Json* schema;
    std::string pointer;
    int depth;
    std::string name;
  };
  struct Edge {
    std::string to, pointer;
  };
  struct Bound {
    bool set = false;
    int64_t v = 0;
    bool strict = false;
  };

  const Json& root_;
  std::vector<std::pair<std::string, std::string>> rules_;  // in the order made
  std::unordered_map<std::string, size_t> index_;           // rule name -> rules_ position
  std::unordered_map<std::string, std::string> by_body_;    // shared helper rules
  std::set<std::string> taken_;                             // every name in use or reserved
  std::set<std::string> added_primitives_;
  std::map<std::string, std::string> refs_;             // reference pointer -> rule name
  std::deque<Pending> todo_;                            // referenced schemas still to convert
  std::map<std::string, std::vector<Edge>> head_refs_;  // rule -> refs it starts with
  std::string current_;                                 // the rule being converted
  bool at_head_ = true;  // nothing is matched yet in the current rule
  size_t bytes_ = 0;
  std::unordered_map<const Json*, std::unordered_map<std::string, const Json*>> key_index_;

  // --- rules -------------------------------------------------------------------

  void charge(size_t n, const std::string& ptr) {
    bytes_ += n;
    if (bytes_ > kMaxGrammarBytes) {
      throw SchemaError(strfmt("the grammar grows past %zu bytes", kMaxGrammarBytes), ptr);
    }
  }

  std::string fresh_name(const std::string& hint) {
    const std::string base = sanitize_name(hint);
    std::string name = base;
    for (int k = 2; taken_.count(name); ++k) name = base + "-v" + std::to_string(k);
    taken_.insert(name);
    return name;
  }

  void slot(const std::string& name) {
    index_[name] = rules_.size();
    rules_.push_back({name, ""});
  }

  void set_rule(const std::string& name, const std::string& body) {
    charge(name.size() + body.size() + 6, "");
    rules_[index_.at(name)].second = body;
  }

  // A helper rule; rules with the same body are shared.
  std::string add_rule(const std::string& hint, const std::string& body) {
    auto it = by_body_.find(body);
    if (it != by_body_.end()) return it->second;
    const std::string name = fresh_name(hint);
    slot(name);
    set_rule(name, body);
    by_body_[body] = name;
    return name;
  }

  std::string prim(const std::string& name) {
    if (added_primitives_.insert(name).second) {
      const Primitive& p = primitives().at(name);
      slot(name);
      set_rule(name, p.body);
      for (const char* d : p.deps) prim(d);
    }
    return name;
  }

  // --- keyword readers ---------------------------------------------------------

  static std::string at(const std::string& ptr, const std::string& key) {
    return ptr + "/" + escape_pointer(key);
  }

  // A non-negative integer count (minItems, maxLength, ...), or -1 when absent.
  int64_t read_count(const Json& s, const char* key, const std::string& ptr, int64_t limit) {
    auto it = s.find(key);
    if (it == s.end()) return -1;
    const std::string kp = at(ptr, key);
    const double v = it->is_number() ? it->template get<double>() : -1;
    if (!(v >= 0) || std::floor(v) != v) {
      throw SchemaError(strfmt("'%s' must be a non-negative integer", key), kp);
    }
    if (v > static_cast<double>(limit)) {
      throw SchemaError(
          strfmt("'%s' above %lld is not supported", key, static_cast<long long>(limit)), kp);
    }
    return static_cast<int64_t>(v);
  }

  // The tighter of minimum / exclusiveMinimum (lower) or maximum / exclusiveMaximum
  // (draft 4's boolean exclusive keywords included), clamped to +-kHuge. A bound that
  // is not a whole number is rounded toward the inside for integers and refused for
  // numbers.
  Bound read_bound(const Json& s, const std::string& ptr, bool lower, bool integers) {
    const char* plain = lower ? "minimum" : "maximum";
    const char* excl = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    Bound b;
    auto ex = s.find(excl);
    auto consider = [&](const char* key, bool strict) {
      auto it = s.find(key);
      if (it == s.end()) return;
      const std::string kp = at(ptr, key);
      Bound c{true, 0, strict};
      if (it->is_number_unsigned()) {
        c.v = static_cast<int64_t>(std::min<uint64_t>(it->template get<uint64_t>(), kHuge));
      } else if (it->is_number_integer()) {
        c.v = std::clamp<int64_t>(it->template get<int64_t>(), -kHuge, kHuge);
      } else if (it->is_number_float()) {
        double d = it->template get<double>();
        if (std::floor(d) != d) {
          if (!integers) {
            throw SchemaError(strfmt("'%s' is supported for numbers only as a whole number", key),
                              kp);
          }
          d = lower ? std::ceil(d) : std::floor(d);
          c.strict = false;
        }
        c.v = d > kHuge ? kHuge : d < -kHuge ? -kHuge : static_cast<int64_t>(d);
      } else {
        throw SchemaError(strfmt("'%s' must be a number", key), kp);
      }
      const bool tighter =
          !b.set || (lower ? c.v > b.v : c.v < b.v) || (c.v == b.v && c.strict && !b.strict);
      if (tighter) b = c;
    };
    consider(plain, ex != s.end() && ex->is_boolean() && ex->template get<bool>());
    if (ex != s.end() && !ex->is_boolean()) consider(excl, true);
    return b;
  }

  std::vector<std::string> read_types(const Json& s, const std::string& ptr) {
    std::vector<std::string> out;
    auto it = s.find("type");
    if (it == s.end()) return out;
    const std::string tp = at(ptr, "type");
    auto add = [&](const Json& t, const std::string& p) {
      if (!t.is_string()) throw SchemaError("'type' must be a string or an array of them", p);
      const std::string name = t.template get<std::string>();
      if (std::find(std::begin(kTypes), std::end(kTypes), name) == std::end(kTypes)) {
        throw SchemaError("unknown type '" + name + "'", p);
      }
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    };
    if (it->is_array()) {
      if (it->empty()) throw SchemaError("'type' is an empty array", tp);
      for (size_t i = 0; i < it->size(); ++i) add((*it)[i], tp + "/" + std::to_string(i));
    } else {
      add(*it, tp);
    }
    return out;
  }

  static bool has_type(const Json& v, const std::string& type) {
    if (type == "null") return v.is_null();
    if (type == "boolean") return v.is_boolean();
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    if (type == "string") return v.is_string();
    if (type == "number") return v.is_number();
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.template get<double>();
    return std::isfinite(d) && std::floor(d) == d;
  }

  // A handled validation keyword of `s` other than those allowed, or nullptr.
  static const char* other_keyword(const Json& s, std::initializer_list<const char*> allowed) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (!kHandled.count(k)) continue;
      bool ok = false;
      for (const char* a : allowed) ok = ok || k == a;
      if (!ok) return kHandled.find(k)->c_str();
    }
    return nullptr;
  }

  void refuse_others(const Json& s, const std::string& ptr, const char* keyword,
                     std::initializer_list<const char*> allowed) {
    if (const char* k = other_keyword(s, allowed)) {
      throw SchemaError(strfmt("'%s' together with '%s' is not supported", keyword, k), at(ptr, k));
    }
  }

  // --- schemas -----------------------------------------------------------------

  std::string visit(const Json& s, const std::string& ptr, int depth, const std::string& hint) {
    if (depth > kMaxDepth) {
      throw SchemaError(strfmt("schemas nest deeper than %d levels", kMaxDepth), ptr);
    }
    if (s.is_boolean()) {
      if (s.template get<bool>()) return prim("value");
      throw SchemaError("the schema false admits no value", ptr);
    }
    if (!s.is_object()) throw SchemaError("a schema must be an object or a boolean", ptr);
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (kUnsupported.count(it.key())) {
        throw SchemaError(
            "'" + it.key() + "' is not supported" + (it.key() == "oneOf" ? "; use 'anyOf'" : ""),
            at(ptr, it.key()));
      }
    }
    if (!ptr.empty() && s.contains("$id")) {
      throw SchemaError("'$id' is supported only at the root", at(ptr, "$id"));
    }
    if (s.contains("$ref")) {
      refuse_others(s, ptr, "$ref", {"$ref"});
      const Json& r = s["$ref"];
      if (!r.is_string()) throw SchemaError("'$ref' must be a string", at(ptr, "$ref"));
      return reference(r.template get<std::string>(), at(ptr, "$ref"));
    }
    if (s.contains("allOf")) {
      refuse_others(s, ptr, "allOf", {"allOf"});
      const Json& a = s["allOf"];
      const std::string ap = at(ptr, "allOf");
      if (!a.is_array() || a.empty()) throw SchemaError("'allOf' must be a non-empty array", ap);
      if (a.size() > 1) throw SchemaError("'allOf' with more than one schema is not supported", ap);
      return visit(a[0], ap + "/0", depth + 1, hint);
    }
    if (s.contains("anyOf")) {
      refuse_others(s, ptr, "anyOf", {"anyOf"});
      const Json& a = s["anyOf"];
      const std::string ap = at(ptr, "anyOf");
      if (!a.is_array() || a.empty()) throw SchemaError("'anyOf' must be a non-empty array", ap);
      std::vector<std::string> alts;
      std::set<std::string> seen;
      for (size_t i = 0; i < a.size(); ++i) {
        std::string e = visit(a[i], ap + "/" + std::to_string(i), depth + 1,
                              a.size() == 1 ? hint : join_name(hint, "alt" + std::to_string(i)));
        if (seen.insert(e).second) alts.push_back(std::move(e));
      }
      return group(alts);
    }
    if (s.contains("enum") || s.contains("const")) return enumeration(s, ptr);

    std::vector<std::string> types = read_types(s, ptr);
    if (types.empty()) {
      for (const auto& [type, keys] : implied_types()) {
        for (const std::string& k : keys) {
          if (s.contains(k) && std::find(types.begin(), types.end(), type) == types.end()) {
            types.push_back(type);
          }
        }
      }
    }
    if (types.empty()) return prim("value");
    if (std::find(types.begin(), types.end(), "number") != types.end()) {
      types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) {
      if (t == "object") {
        alts.push_back(object(s, ptr, depth, hint));
      } else if (t == "array") {
        alts.push_back(array(s, ptr, depth, hint));
      } else if (t == "string") {
        alts.push_back(string(s, ptr));
      } else if (t == "integer") {
        alts.push_back(integer(s, ptr, hint));
      } else if (t == "number") {
        alts.push_back(number(s, ptr, hint));
      } else {
        alts.push_back(prim(t));
      }
    }
    return group(alts);
  }

  // A rule for a local reference ("#", "#/$defs/name", any JSON pointer into the
  // document), converted later from the queue so that recursive schemas work.
  std::string reference(const std::string& ref, const std::string& ref_ptr) {
    if (ref.empty() || ref[0] != '#') {
      throw SchemaError("only local references ('#/...') are supported", ref_ptr);
    }
    std::string frag;  // the fragment, percent-decoded
    auto hex = [](char c) {
      return c >= '0' && c <= '9'   ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    for (size_t i = 1; i < ref.size(); ++i) {
      if (ref[i] == '%' && i + 2 < ref.size() && hex(ref[i + 1]) >= 0 && hex(ref[i + 2]) >= 0) {
        frag += static_cast<char>(hex(ref[i + 1]) * 16 + hex(ref[i + 2]));
        i += 2;
      } else {
        frag += ref[i];
      }
    }
    std::string name;
    auto known = refs_.find(frag);
    if (known != refs_.end()) {
      name = known->second;
    } else {
      int levels = 0;
      std::string last = "ref";
      const Json* target = resolve(frag, levels, last);
      if (!target) {
        throw SchemaError(
            "'$ref' " + ref + " points nowhere (only '#' and JSON pointers are supported)",
            ref_ptr);
      }
      if (levels > kMaxDepth) {
        throw SchemaError(strfmt("schemas nest deeper than %d levels", kMaxDepth), ref_ptr);
      }
      name = fresh_name(last);
      slot(name);
      refs_[frag] = name;
      todo_.push_back({target, frag, levels, name});
    }
    if (at_head_) head_refs_[current_].push_back({name, ref_ptr});
    return name;
  }

  // The value at a JSON pointer, or null; with the schema levels down to it (the
  // segments, less the keywords that hold schemas by name or index) and the last
  // segment. Objects get a key index, since ordered_json looks keys up one by one.
  const Json* resolve(const std::string& pointer, int& levels, std::string& last) {
    static const std::set<std::string> containers =
        words("$defs definitions properties anyOf allOf prefixItems");
    if (!pointer.empty() && pointer[0] != '/') return nullptr;
    const Json* cur = &root_;
    for (size_t i = 1; i <= pointer.size();) {
      const size_t j = std::min(pointer.find('/', i), pointer.size());
      std::string seg;
      for (size_t k = i; k < j; ++k) {
        if (pointer[k] != '~') {
          seg += pointer[k];
        } else if (k + 1 < j && (pointer[k + 1] == '0' || pointer[k + 1] == '1')) {
          seg += pointer[++k] == '0' ? '~' : '/';
        } else {
          return nullptr;
        }
      }
      i = j + 1;
      levels += containers.count(seg) ? 0 : 1;
      last = seg;
      if (cur->is_object()) {
        auto [index, fresh] = key_index_.try_emplace(cur);
        if (fresh) {
          for (auto it = cur->begin(); it != cur->end(); ++it)
            index->second.emplace(it.key(), &*it);
        }
        auto it = index->second.find(seg);
        if (it == index->second.end()) return nullptr;
        cur = it->second;
      } else if (cur->is_array() && !seg.empty() && seg.size() < 10 &&
                 seg.find_first_not_of("0123456789") == std::string::npos &&
                 (seg == "0" || seg[0] != '0') && std::stoul(seg) < cur->size()) {
        cur = &(*cur)[std::stoul(seg)];
      } else {
        return nullptr;
      }
    }
    return cur;
  }

  // A reference cycle with nothing matched in between would be left recursion (a
  // schema that is itself, or one of its own alternatives).
  void check_ref_cycles() {
    std::map<std::string, int> state;  // 1 on the path, 2 done
    std::vector<std::pair<std::string, size_t>> path;
    for (const auto& start : head_refs_) {
      if (state[start.first]) continue;
      path.push_back({start.first, 0});
      state[start.first] = 1;
      while (!path.empty()) {
        auto& [rule, k] = path.back();
        const std::vector<Edge>& edges = head_refs_[rule];
        if (k == edges.size()) {
          state[rule] = 2;
          path.pop_back();
          continue;
        }
        const Edge& e = edges[k++];
        if (state[e.to] == 1) {
          throw SchemaError("'$ref' cycle with no object or array in between", e.pointer);
        }
        if (state[e.to] == 0) {
          state[e.to] = 1;
          path.push_back({e.to, 0});
        }
      }
    }
  }

  std::string enumeration(const Json& s, const std::string& ptr) {
    const char* keyword = s.contains("const") ? "const" : "enum";
    refuse_others(s, ptr, keyword, {"enum", "const", "type"});
    std::vector<std::pair<const Json*, std::string>> values;  // value, pointer
    auto checked = [&](const Json& v, const std::string& p) -> const Json& {
      if (value_depth(v, kMaxDepth) > kMaxDepth) {
        throw SchemaError(strfmt("values nest deeper than %d levels", kMaxDepth), p);
      }
      return v;
    };
    if (s.contains("enum")) {
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty()) {
        throw SchemaError("'enum' must be a non-empty array", at(ptr, "enum"));
      }
      for (size_t i = 0; i < e.size(); ++i) {
        const std::string p = at(ptr, "enum") + "/" + std::to_string(i);
        values.push_back({&checked(e[i], p), p});
      }
    }
    if (s.contains("const")) {
      const Json& c = checked(s["const"], at(ptr, "const"));
      if (s.contains("enum")) {
        values.erase(std::remove_if(values.begin(), values.end(),
                                    [&](const auto& v) { return !(*v.first == c); }),
                     values.end());
      } else {
        values.push_back({&c, at(ptr, "const")});
      }
    }
    const std::vector<std::string> types = read_types(s, ptr);
    if (!types.empty()) {
      values.erase(std::remove_if(values.begin(), values.end(),
                                  [&](const auto& v) {
                                    for (const std::string& t : types) {
                                      if (has_type(*v.first, t)) return false;
                                    }
                                    return true;
                                  }),
                   values.end());
    }
    if (values.empty()) {
      throw SchemaError(strfmt("no value satisfies both '%s' and its sibling keywords", keyword),
                        ptr);
    }
    std::vector<std::string> alts;
    std::set<std::string> seen;
    size_t size = 0;
    for (const auto& [v, p] : values) {
      std::string text;
      try {
        text = v->dump(-1, ' ', false, Json::error_handler_t::strict);
      } catch (const std::exception&) {
        throw SchemaError("invalid UTF-8 in a string", p);
      }
      std::string lit = gbnf_literal(text, p);
      size += lit.size() + 3;
      if (size > kMaxGrammarBytes) {
        throw SchemaError(strfmt("the grammar grows past %zu bytes", kMaxGrammarBytes), p);
      }
      if (seen.insert(lit).second) alts.push_back(std::move(lit));
    }
    prim("space");
    return group(alts) + " space";
  }

  // Objects emit only the declared properties (valid whatever additionalProperties
  // says), in the schema's order; required ones always, optional ones or not. With no
  // properties declared the object is a map from any key to additionalProperties.
  std::string object(const Json& s, const std::string& ptr, int depth, const std::string& hint) {
    FlagScope inside(at_head_, false);
    const Json* props = nullptr;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object())
        throw SchemaError("'properties' must be an object", at(ptr, "properties"));
      props = &*it;
    }
    std::vector<std::string> required;  // in order, without repeats
    std::set<std::string> required_set;
    if (auto it = s.find("required"); it != s.end()) {
      const std::string rp = at(ptr, "required");
      if (!it->is_array()) throw SchemaError("'required' must be an array of strings", rp);
      for (size_t i = 0; i < it->size(); ++i) {
        const Json& k = (*it)[i];
        if (!k.is_string()) {
          throw SchemaError("'required' must be an array of strings", rp + "/" + std::to_string(i));
        }
        const std::string key = k.template get<std::string>();
        if (required_set.insert(key).second) required.push_back(key);
      }
    }
    const Json* extra = nullptr;  // the additionalProperties schema; null: any value
    bool extra_allowed = true;
    const std::string xp = at(ptr, "additionalProperties");
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean()) {
        extra_allowed = it->template get<bool>();
      } else if (it->is_object()) {
        extra = &*it;
      } else {
        throw SchemaError("'additionalProperties' must be a schema", xp);
      }
    }
    const int64_t min_props = read_count(s, "minProperties", ptr, INT64_MAX);
    const int64_t max_props = read_count(s, "maxProperties", ptr, INT64_MAX);
    prim("space");

    struct Prop {
      std::string key;
      const Json* schema;  // null: any value
      std::string ptr;
      bool required;
    };
    std::vector<Prop> items;
    std::set<std::string> declared;  // ordered_json looks keys up one by one
    if (props) {
      for (auto it = props->begin(); it != props->end(); ++it) {
        const std::string pp = at(at(ptr, "properties"), it.key());
        const bool req = required_set.count(it.key()) > 0;
        if (it->is_boolean() && !it->template get<bool>()) {
          if (req)
            throw SchemaError("required property '" + it.key() + "' has the schema false", pp);
          continue;
        }
        declared.insert(it.key());
        items.push_back({it.key(), &*it, pp, req});
      }
    }
    for (size_t i = 0; i < required.size(); ++i) {
      if (declared.count(required[i])) continue;
      if (!extra_allowed) {
        throw SchemaError("required property '" + required[i] +
                              "' is not declared and additionalProperties is false",
                          at(ptr, "required") + "/" + std::to_string(i));
      }
      items.push_back({required[i], extra, extra ? xp : ptr, true});
    }

    if (items.empty() && (!props || props->empty()) && extra_allowed) {
      // A map: any keys, values under additionalProperties. Repeated keys can only
      // lower the count of properties, so maxProperties holds, and minProperties 1.
      if (min_props > 1) {
        throw SchemaError("'minProperties' above 1 is not supported without 'properties'",
                          at(ptr, "minProperties"));
      }
      if (max_props > kMaxCount) {
        throw SchemaError(strfmt("'maxProperties' above %lld is not supported",
                                 static_cast<long long>(kMaxCount)),
                          at(ptr, "maxProperties"));
      }
      if (max_props == 0) return add_rule(hint, "\"{\" space \"}\" space");
      if (!extra && min_props < 1 && max_props < 0) return prim("object");
      const std::string value =
          extra ? visit(*extra, xp, depth + 1, join_name(hint, "value")) : prim("value");
      const std::string kv = prim("string") + " \":\" space " + value;
      std::string members = kv;
      if (max_props != 1) {
        if (max_props > 0) charge(kRepeatCost * static_cast<size_t>(max_props), ptr);
        members +=
            " (\",\" space " + kv + ")" + repeat_suffix(0, max_props < 0 ? -1 : max_props - 1);
      }
      if (min_props < 1) members = "(" + members + ")?";
      return add_rule(hint, "\"{\" space " + members + " \"}\" space");
    }

    const int64_t n_required =
        std::count_if(items.begin(), items.end(), [](const Prop& p) { return p.required; });
    if (min_props > n_required) {
      throw SchemaError("'minProperties' above the number of required properties is not supported",
                        at(ptr, "minProperties"));
    }
    if (max_props >= 0 && max_props < static_cast<int64_t>(items.size())) {
      throw SchemaError("'maxProperties' below the number of properties is not supported",
                        at(ptr, "maxProperties"));
    }
    if (items.empty()) return add_rule(hint, "\"{\" space \"}\" space");

    std::vector<std::string> kvs;
    for (const Prop& p : items) {
      std::string key_text;
      try {
        key_text = Json(p.key).dump(-1, ' ', false, Json::error_handler_t::strict);
      } catch (const std::exception&) {
        throw SchemaError("invalid UTF-8 in a property name", p.ptr);
      }
      const std::string value =
          p.schema ? visit(*p.schema, p.ptr, depth + 1, join_name(hint, p.key)) : prim("value");
      kvs.push_back(gbnf_literal(key_text, p.ptr) + " space \":\" space " + value);
    }
    const size_t n = items.size();
    if (n_required == static_cast<int64_t>(n)) {
      std::string body = "\"{\" space " + kvs[0];
      for (size_t k = 1; k < n; ++k) body += " \",\" space " + kvs[k];
      return add_rule(hint, body + " \"}\" space");
    }

    // With optional properties a comma goes before every property but the first one
    // present. after(k): properties k.. once one is out; first(k): properties k.. while
    // none is yet (up to the first required one).
    for (size_t k = 0; k < n; ++k) {
      kvs[k] = add_rule(join_name(join_name(hint, items[k].key), "kv"), kvs[k]);
    }
    std::vector<std::string> after(n + 1);
    for (size_t k = n; k-- > 1;) {
      std::string body =
          items[k].required ? "\",\" space " + kvs[k] : "(\",\" space " + kvs[k] + ")?";
      if (!after[k + 1].empty()) body += " " + after[k + 1];
      after[k] = add_rule(join_name(hint, "after" + std::to_string(k)), body);
    }
    size_t first_required = 0;
    while (first_required < n && !items[first_required].required) ++first_required;
    std::string first;  // first(k) for k going down
    for (size_t k = std::min(first_required, n - 1) + 1; k-- > 0;) {
      std::string body = kvs[k] + (after[k + 1].empty() ? "" : " " + after[k + 1]);
      if (k < first_required && !first.empty()) body += " | " + first;
      first = add_rule(join_name(hint, "first" + std::to_string(k)), body);
    }
    const std::string members = first_required < n ? first : first + "?";
    return add_rule(hint, "\"{\" space " + members + " \"}\" space");
  }

  // Arrays: prefixItems (or draft 2019's array-valued items) position by position, then
  // items for the rest, with minItems / maxItems as bounded repetition.
  std::string array(const Json& s, const std::string& ptr, int depth, const std::string& hint) {
    FlagScope inside(at_head_, false);
    const int64_t min_items = std::max<int64_t>(read_count(s, "minItems", ptr, kMaxCount), 0);
    int64_t max_items = read_count(s, "maxItems", ptr, kMaxCount);  // -1: unbounded
    if (max_items >= 0 && min_items > max_items) {
      throw SchemaError("'minItems' is above 'maxItems'", at(ptr, "minItems"));
    }
    if (auto it = s.find("uniqueItems"); it != s.end()) {
      if (!it->is_boolean())
        throw SchemaError("'uniqueItems' must be a boolean", at(ptr, "uniqueItems"));
      if (it->template get<bool>() && (max_items < 0 || max_items > 1)) {
        throw SchemaError("'uniqueItems' is not supported", at(ptr, "uniqueItems"));
      }
    }
    std::vector<std::pair<const Json*, std::string>> prefix;  // schema, pointer
    const Json* tail = nullptr;                               // null: any value
    std::string tail_ptr;
    bool tail_allowed = true;
    auto set_tail = [&](const Json& t, const std::string& p) {
      if (t.is_boolean()) {
        tail_allowed = t.template get<bool>();
      } else {
        tail = &t;
        tail_ptr = p;
      }
    };
    auto read_prefix = [&](const Json& a, const std::string& p) {
      if (!a.is_array()) throw SchemaError("'prefixItems' must be an array of schemas", p);
      for (size_t i = 0; i < a.size(); ++i) prefix.push_back({&a[i], p + "/" + std::to_string(i)});
    };
    auto items = s.find("items");
    if (auto pi = s.find("prefixItems"); pi != s.end()) {
      read_prefix(*pi, at(ptr, "prefixItems"));
      if (s.contains("additionalItems")) {
        throw SchemaError("'additionalItems' with 'prefixItems' is not supported",
                          at(ptr, "additionalItems"));
      }
      if (items != s.end()) {
        if (items->is_array()) {
          throw SchemaError("'items' must be a schema beside 'prefixItems'", at(ptr, "items"));
        }
        set_tail(*items, at(ptr, "items"));
      }
    } else if (items != s.end() && items->is_array()) {
      read_prefix(*items, at(ptr, "items"));
      if (auto ai = s.find("additionalItems"); ai != s.end()) {
        set_tail(*ai, at(ptr, "additionalItems"));
      }
    } else if (items != s.end()) {
      set_tail(*items, at(ptr, "items"));
    }
    // A prefix schema false ends the array before it.
    for (size_t i = 0; i < prefix.size(); ++i) {
      const Json& p = *prefix[i].first;
      if (p.is_boolean() && !p.template get<bool>()) {
        prefix.resize(i);
        tail_allowed = false;
        break;
      }
    }
    if (!tail_allowed) {
      const int64_t most = static_cast<int64_t>(prefix.size());
      if (min_items > most) {
        throw SchemaError("'minItems' is above the number of items the schema allows",
                          at(ptr, "minItems"));
      }
      max_items = max_items < 0 ? most : std::min(max_items, most);
    }
    prim("space");
    if (max_items == 0) return add_rule(hint, "\"[\" space \"]\" space");
    if (max_items > 0) charge(kRepeatCost * static_cast<size_t>(max_items), ptr);

    const size_t k =
        max_items < 0 ? prefix.size() : std::min(prefix.size(), static_cast<size_t>(max_items));
    std::string tail_expr;  // the items after the prefix, each with its comma
    if (tail_allowed && (max_items < 0 || max_items > static_cast<int64_t>(k))) {
      const std::string t =
          tail ? visit(*tail, tail_ptr, depth + 1, join_name(hint, "item")) : prim("value");
      if (k == 0) {
        // No prefix: the first item has no comma.
        std::string seq = t;
        const int64_t hi = max_items < 0 ? -1 : max_items - 1;
        if (hi != 0)
          seq +=
              " (\",\" space " + t + ")" + repeat_suffix(std::max<int64_t>(min_items - 1, 0), hi);
        if (min_items == 0) seq = "(" + seq + ")?";
        return add_rule(hint, "\"[\" space " + seq + " \"]\" space");
      }
      const int64_t lo = std::max<int64_t>(min_items - static_cast<int64_t>(k), 0);
      const int64_t hi = max_items < 0 ? -1 : max_items - static_cast<int64_t>(k);
      tail_expr = "(\",\" space " + t + ")" + repeat_suffix(lo, hi);
    }
    std::string rest = tail_expr;
    for (size_t i = k; i-- > 0;) {
      const std::string item = visit(*prefix[i].first, prefix[i].second, depth + 1,
                                     join_name(hint, "item" + std::to_string(i)));
      std::string seq = (i ? "\",\" space " : "") + item + (rest.empty() ? "" : " " + rest);
      if (static_cast<int64_t>(i) >= min_items) {
        rest = add_rule(join_name(hint, "from" + std::to_string(i)), seq) + "?";
      } else {
        rest = seq;
      }
    }
    return add_rule(hint, "\"[\" space " + rest + " \"]\" space");
  }

  std::string string(const Json& s, const std::string& ptr) {
    const int64_t min_len = std::max<int64_t>(read_count(s, "minLength", ptr, kMaxCount), 0);
    const int64_t max_len = read_count(s, "maxLength", ptr, kMaxCount);
    if (max_len >= 0 && min_len > max_len) {
      throw SchemaError("'minLength' is above 'maxLength'", at(ptr, "minLength"));
    }
    prim("space");
    if (auto it = s.find("format"); it != s.end()) {
      const std::string fp = at(ptr, "format");
      if (!it->is_string()) throw SchemaError("'format' must be a string", fp);
      const std::string name = it->template get<std::string>();
      for (const Format& f : kFormats) {
        if (name != f.name) continue;
        if (f.min_len < min_len || (max_len >= 0 && f.max_len > max_len)) {
          throw SchemaError(
              "'minLength' or 'maxLength' together with 'format' '" + name + "' is not supported",
              ptr);
        }
        return prim(name + "-string");
      }
      throw SchemaError("'format' '" + name + "' is not supported", fp);
    }
    if (min_len == 0 && max_len < 0) return prim("string");
    if (max_len == 0) return add_rule("string-empty", "\"\\\"\\\"\" space");
    prim("char");
    charge(kRepeatCost * static_cast<size_t>(max_len < 0 ? min_len : max_len), ptr);
    const std::string name = "string-" + std::to_string(min_len) + "to" +
                             (max_len < 0 ? std::string("any") : std::to_string(max_len));
    return add_rule(name, "\"\\\"\" char" + repeat_suffix(min_len, max_len) + " \"\\\"\" space");
  }

  // Integers in [lo, hi], each bound inclusive after rounding toward the inside; an
  // open side stops at 16 digits (18 when the other bound is already past 16).
  std::string integer(const Json& s, const std::string& ptr, const std::string& hint) {
    const Bound lower = read_bound(s, ptr, true, true), upper = read_bound(s, ptr, false, true);
    if (!lower.set && !upper.set) return prim("integer");
    int64_t lo = lower.strict ? lower.v + 1 : lower.v;
    int64_t hi = upper.strict ? upper.v - 1 : upper.v;
    if (!upper.set) hi = lo > kIntCap ? kBoundCap : kIntCap;
    if (!lower.set) lo = hi < -kIntCap ? -kBoundCap : -kIntCap;
    lo = std::max(lo, -kBoundCap);
    hi = std::min(hi, kBoundCap);
    if (lo > hi) {
      throw SchemaError("no integer of at most 18 digits lies within the bounds", ptr);
    }
    std::vector<std::string> alts;
    if (lo < 0) alts.push_back("\"-\" " + integer_range(std::max<int64_t>(-hi, 1), -lo));
    if (hi >= 0) alts.push_back(integer_range(std::max<int64_t>(lo, 0), hi));
    prim("space");
    return add_rule(hint, group(alts) + " space");
  }

  // Numbers between whole-number bounds: no exponent, the integer part ranged and
  // the fraction required zero or non-zero where a bound is reached.
  std::string number(const Json& s, const std::string& ptr, const std::string& hint) {
    Bound lower = read_bound(s, ptr, true, false), upper = read_bound(s, ptr, false, false);
    if (!lower.set && !upper.set) return prim("number");
    if (lower.set && lower.v < -kBoundCap) lower = {true, -kBoundCap, false};
    if (upper.set && upper.v > kBoundCap) upper = {true, kBoundCap, false};
    if ((lower.set && lower.v > kBoundCap) || (upper.set && upper.v < -kBoundCap)) {
      throw SchemaError("no number of at most 18 integer digits lies within the bounds", ptr);
    }
    std::vector<std::string> alts;
    // x < 0 as -m: m above -maximum (or above 0), below -minimum.
    if (!lower.set || lower.v < 0) {
      const bool hi_neg = upper.set && upper.v < 0;
      const int64_t m_lo = hi_neg ? -upper.v : 0;
      const bool m_lo_strict = hi_neg ? upper.strict : true;
      const int64_t cap = m_lo > kIntCap ? kBoundCap : kIntCap;
      magnitude_pieces(m_lo, m_lo_strict, lower.set, lower.set ? -lower.v : 0, lower.strict, cap,
                       "\"-\" ", alts);
    }
    // x >= 0.
    if (!upper.set || upper.v >= 0) {
      const bool lo_pos = lower.set && lower.v >= 0;
      const int64_t x_lo = lo_pos ? lower.v : 0;
      const int64_t cap = x_lo > kIntCap ? kBoundCap : kIntCap;
      magnitude_pieces(x_lo, lo_pos && lower.strict, upper.set, upper.set ? upper.v : 0,
                       upper.strict, cap, "", alts);
    }
    if (alts.empty()) throw SchemaError("no number lies within the bounds", ptr);
    prim("space");
    return add_rule(hint, group(alts) + " space");
  }
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::json& schema) {
  return Converter<nlohmann::json>(schema).run();
}

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  return Converter<nlohmann::ordered_json>(schema).run();
}

std::string json_object_gbnf() { return json_schema_to_gbnf(nlohmann::json{{"type", "object"}}); }

}  // namespace kivi::grammar

#include "grammar/gbnf.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

namespace kivi::grammar {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 100000;         // largest m or n of x{m,n}
constexpr size_t kMaxElements = 4u << 20;  // generated table size at most
constexpr int kMaxNesting = 256;           // parentheses deep

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

}  // namespace

GrammarError::GrammarError(const std::string& what, size_t offset, int line, int column)
    : Error(strfmt("grammar error at line %d, column %d: %s", line, column, what.c_str())),
      offset_(offset),
      line_(line),
      column_(column) {}

bool Grammar::matches(uint32_t pos, uint32_t cp) const {
  const Element& e = elements_[pos];
  bool in = false;
  for (uint32_t i = 0; i < e.count && !in; ++i) {
    const CharRange& r = ranges_[e.value + i];
    in = cp >= r.lo && cp <= r.hi;
  }
  return e.kind == Element::kChars ? in : !in;
}

bool Grammar::matches_some(uint32_t pos, uint32_t lo, uint32_t hi) const {
  const Element& e = elements_[pos];
  if (e.kind == Element::kChars) {
    for (uint32_t i = 0; i < e.count; ++i) {
      const CharRange& r = ranges_[e.value + i];
      if (r.lo <= hi && lo <= r.hi) return true;
    }
    return false;
  }
  // The complement takes some code point of [lo, hi] unless the ranges cover all of it.
  std::vector<CharRange> rs(ranges_.begin() + e.value, ranges_.begin() + e.value + e.count);
  std::sort(rs.begin(), rs.end(),
            [](const CharRange& a, const CharRange& b) { return a.lo < b.lo; });
  uint32_t next = lo;  // the lowest code point not yet known to be covered
  for (const CharRange& r : rs) {
    if (r.lo > next) break;
    if (r.hi >= next) {
      if (r.hi >= hi) return false;
      next = r.hi + 1;
    }
  }
  return next <= hi;
}

// A recursive-descent parser. Each alternative is parsed into a sequence of "items"
// (a class or a rule reference); groups and repetitions become generated rules.
class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Grammar run() {
    skip_space(true);
    while (i_ < s_.size()) {
      parse_rule();
      skip_space(true);
    }
    finish();
    return std::move(g_);
  }

 private:
  using Seq = std::vector<Element>;  // one alternative; kRule values are rule ids
  std::string_view s_;
  size_t i_ = 0;
  Grammar g_;
  std::vector<std::vector<Seq>> bodies_;  // per rule; empty until defined
  std::vector<size_t> defined_at_;        // offset of the definition, or npos
  std::vector<size_t> first_use_;         // offset of the first reference
  std::unordered_map<std::string, uint32_t> ids_;
  int depth_ = 0;
  size_t elements_ = 0;
  bool next_rule_ = false;  // the last rule ended where the next one's name starts
  std::unordered_map<std::string, int> generated_;  // the last number per generated base

  [[noreturn]] void error(const std::string& what, size_t at) const {
    at = std::min(at, s_.size());
    int line = 1, col = 1;
    for (size_t k = 0; k < at; ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<unsigned char>(s_[k]) & 0xC0) != 0x80) {
        ++col;
      }
    }
    throw GrammarError(what, at, line, col);
  }
  [[noreturn]] void error(const std::string& what) const { error(what, i_); }

  // Spaces, tabs and comments; newlines too when `newlines` (between rules, or inside
  // parentheses, or after `|` and `::=`).
  void skip_space(bool newlines) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else if (c == '\n' && newlines) {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) { return is_name_char(c); }

  std::string parse_name() {
    const size_t start = i_;
    while (i_ < s_.size() && name_char(s_[i_])) ++i_;
    if (i_ == start) error("expected a rule name");
    return std::string(s_.substr(start, i_ - start));
  }

  uint32_t rule_id(const std::string& name, size_t at) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = static_cast<uint32_t>(g_.names_.size());
    g_.names_.push_back(name);
    bodies_.emplace_back();
    defined_at_.push_back(std::string::npos);
    first_use_.push_back(at);
    ids_.emplace(name, id);
    return id;
  }

  uint32_t new_rule(const std::string& base, std::vector<Seq> body) {
    // Generated names continue from the last one made for this base (a bounded
    // repetition makes thousands).
    int& k = generated_[base];
    std::string name;
    do {
      name = base + "-" + std::to_string(++k);
    } while (ids_.count(name));
    const uint32_t id = rule_id(name, i_);
    defined_at_[id] = i_;
    bodies_[id] = std::move(body);
    count(bodies_[id]);
    return id;
  }

  void count(const std::vector<Seq>& body) {
    for (const Seq& q : body) elements_ += q.size() + 1;
    if (elements_ > kMaxElements) error("the grammar is too large");
  }

  void parse_rule() {
    const size_t at = i_;
    const std::string name = parse_name();
    skip_space(false);
    if (s_.substr(i_, 3) != "::=") error("expected '::=' after rule name '" + name + "'");
    i_ += 3;
    const uint32_t id = rule_id(name, at);
    if (defined_at_[id] != std::string::npos) error("rule '" + name + "' is defined twice", at);
    defined_at_[id] = at;
    skip_space(true);
    std::vector<Seq> body = parse_alternatives(name, false);
    count(body);
    bodies_[id] = std::move(body);
    if (i_ < s_.size() && s_[i_] != '\n' && !next_rule_)
      error("unexpected character after the rule");
    next_rule_ = false;
  }

  // Alternatives up to the end of the line (top level) or the closing parenthesis.
  std::vector<Seq> parse_alternatives(const std::string& name, bool nested) {
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(name, nested));
    for (;;) {
      if (!nested && !next_rule_ && i_ < s_.size() && s_[i_] == '\n') {
        // An alternative may start a new line with '|'.
        const size_t save = i_;
        skip_space(true);
        if (i_ >= s_.size() || s_[i_] != '|') {
          i_ = save;
          break;
        }
      }
      if (next_rule_ || i_ >= s_.size() || s_[i_] != '|') break;
      ++i_;
      skip_space(true);
      alts.push_back(parse_sequence(name, nested));
    }
    return alts;
  }

  Seq parse_sequence(const std::string& name, bool nested) {
    Seq seq;
    size_t last_start = 0;  // where the last item's elements begin in seq
    bool have_last = false;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      const size_t at = i_;
      if (c == '"') {
        ++i_;
        last_start = seq.size();
        have_last = true;
        size_t n = 0;
        while (i_ < s_.size() && s_[i_] != '"') {
          const uint32_t cp = parse_char();
          seq.push_back(range_element(Element::kChars, {{cp, cp}}));
          ++n;
        }
        if (i_ >= s_.size()) error("unterminated string literal", at);
        ++i_;
        if (n == 0) have_last = false;  // "" matches nothing: a postfix applies to nothing
        if (n > 1) last_start = seq.size() - n;
      } else if (c == '[') {
        ++i_;
        Element::Kind kind = Element::kChars;
        if (i_ < s_.size() && s_[i_] == '^') {
          kind = Element::kCharsNot;
          ++i_;
        }
        std::vector<CharRange> rs;
        while (i_ < s_.size() && s_[i_] != ']') {
          const uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
            ++i_;
            hi = parse_char();
            if (hi < lo) error("character range is reversed", at);
          }
          rs.push_back({lo, hi});
        }
        if (i_ >= s_.size()) error("unterminated character class", at);
        ++i_;
        last_start = seq.size();
        have_last = true;
        seq.push_back(range_element(kind, rs));
      } else if (c == '.') {
        ++i_;
        last_start = seq.size();
        have_last = true;
        seq.push_back(range_element(Element::kChars, {{0, kMaxCodePoint}}));
      } else if (name_char(c)) {
        const std::string ref = parse_name();
        skip_space(false);
        if (s_.substr(i_, 3) == "::=") {
          if (nested) error("missing ')' before the next rule", at);
          i_ = at;  // the next rule starts here (a rule without a newline before it)
          next_rule_ = true;
          break;
        }
        last_start = seq.size();
        have_last = true;
        seq.push_back({Element::kRule, rule_id(ref, at), 0});
        continue;  // spaces already skipped
      } else if (c == '(') {
        ++i_;
        if (++depth_ > kMaxNesting) error("parentheses nest too deep", at);
        skip_space(true);
        std::vector<Seq> alts = parse_alternatives(name, true);
        if (i_ >= s_.size() || s_[i_] != ')') error("expected ')'", at);
        ++i_;
        --depth_;
        last_start = seq.size();
        have_last = true;
        seq.push_back({Element::kRule, new_rule(name, std::move(alts)), 0});
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) error(std::string("'") + c + "' follows nothing it could repeat");
        ++i_;
        int lo = 0, hi = -1;  // hi -1: unbounded
        if (c == '+') lo = 1;
        if (c == '?') hi = 1;
        if (c == '{') parse_braces(lo, hi, at);
        Seq item(seq.begin() + static_cast<ptrdiff_t>(last_start), seq.end());
        seq.resize(last_start);
        repeat(seq, item, lo, hi, name);
        have_last = false;
      } else if (c == '|' || c == ')' || c == '\n') {
        break;
      } else {
        error(std::string("unexpected character '") + c + "'");
      }
      skip_space(nested);
    }
    return seq;
  }

  void parse_braces(int& lo, int& hi, size_t at) {
    auto number = [&]() {
      skip_space(false);
      if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') error("expected a number", at);
      long v = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        v = v * 10 + (s_[i_++] - '0');
        if (v > kMaxRepeat) error(strfmt("repetition count above %d", kMaxRepeat), at);
      }
      skip_space(false);
      return static_cast<int>(v);
    };
    lo = number();
    hi = lo;
    if (i_ < s_.size() && s_[i_] == ',') {
      ++i_;
      skip_space(false);
      hi = (i_ < s_.size() && s_[i_] == '}') ? -1 : number();
    }
    if (i_ >= s_.size() || s_[i_] != '}') error("expected '}'", at);
    ++i_;
    if (hi >= 0 && hi < lo) error("repetition {m,n} with n < m", at);
  }

  // Appends `item` repeated lo to hi times (hi < 0: unbounded) to seq.
  void repeat(Seq& seq, const Seq& item, int lo, int hi, const std::string& name) {
    if (static_cast<size_t>(lo) * item.size() + elements_ > kMaxElements)
      error("the grammar is too large");
    for (int k = 0; k < lo; ++k) seq.insert(seq.end(), item.begin(), item.end());
    if (hi < 0) {
      // star ::= item star | (empty): right recursion, which the matcher runs without
      // growing its stack.
      const uint32_t star = new_rule(name, {});
      Seq loop = item;
      loop.push_back({Element::kRule, star, 0});
      bodies_[star] = {loop, Seq{}};
      count(bodies_[star]);
      seq.push_back({Element::kRule, star, 0});
      return;
    }
    // opt_k ::= item opt_{k-1} | (empty), nested hi - lo deep.
    uint32_t tail = 0;
    bool have_tail = false;
    for (int k = 0; k < hi - lo; ++k) {
      Seq one = item;
      if (have_tail) one.push_back({Element::kRule, tail, 0});
      tail = new_rule(name, {one, Seq{}});
      have_tail = true;
    }
    if (have_tail) seq.push_back({Element::kRule, tail, 0});
  }

  Element range_element(Element::Kind kind, const std::vector<CharRange>& rs) {
    Element e{kind, static_cast<uint32_t>(g_.ranges_.size()), static_cast<uint32_t>(rs.size())};
    g_.ranges_.insert(g_.ranges_.end(), rs.begin(), rs.end());
    return e;
  }

  // One character of a literal or class: UTF-8 or an escape.
  uint32_t parse_char() {
    const size_t at = i_;
    const unsigned char c = static_cast<unsigned char>(s_[i_]);
    if (c == '\\') {
      if (++i_ >= s_.size()) error("unterminated escape", at);
      const char e = s_[i_++];
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '\'':
          return static_cast<unsigned char>(e);
        case 'x':
          return parse_hex(2, at);
        case 'u':
          return parse_hex(4, at);
        case 'U':
          return parse_hex(8, at);
        default:
          error(std::string("unknown escape '\\") + e + "'", at);
      }
    }
    if (c < 0x80) {
      ++i_;
      return c;
    }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || c > 0xF4 || i_ + len > s_.size()) error("invalid UTF-8", at);
    uint32_t cp = c & (0x3F >> (len - 1));
    for (int k = 1; k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s_[i_ + k]);
      if ((d & 0xC0) != 0x80) error("invalid UTF-8", at);
      cp = (cp << 6) | (d & 0x3F);
    }
    i_ += len;
    if (cp > kMaxCodePoint) error("invalid UTF-8", at);
    return cp;
  }

  uint32_t parse_hex(int digits, size_t at) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= s_.size()) error("unterminated escape", at);
      const char h = s_[i_++];
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) error("bad hexadecimal digit in escape", at);
      v = v * 16 + static_cast<uint32_t>(d);
    }
    if (v > kMaxCodePoint) error("code point above U+10FFFF", at);
    return v;
  }

  // Flattens the rules into the table and checks them: every rule defined, a root,
  // no left recursion (the matcher would loop).
  void finish() {
    auto root = ids_.find("root");
    if (root == ids_.end()) error("the grammar has no rule 'root'", 0);
    g_.root_ = root->second;
    for (size_t r = 0; r < bodies_.size(); ++r) {
      if (defined_at_[r] == std::string::npos)
        error("rule '" + g_.names_[r] + "' is used but not defined", first_use_[r]);
    }
    check_left_recursion();
    g_.rules_.resize(bodies_.size());
    for (size_t r = 0; r < bodies_.size(); ++r) {
      for (const Seq& alt : bodies_[r]) {
        g_.rules_[r].push_back(static_cast<uint32_t>(g_.elements_.size()));
        g_.elements_.insert(g_.elements_.end(), alt.begin(), alt.end());
        g_.elements_.push_back({Element::kEnd, 0, 0});
      }
    }
  }

  void check_left_recursion() {
    const size_t n = bodies_.size();
    // Nullable rules (can match empty text), to a fixed point.
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& alt : bodies_[r]) {
          bool all = true;
          for (const Element& e : alt) {
            if (e.kind != Element::kRule || !nullable[e.value]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Rules reachable at the left edge (past nullable references); a cycle among them is
    // left recursion.
    std::vector<std::vector<uint32_t>> left(n);
    for (size_t r = 0; r < n; ++r) {
      for (const Seq& alt : bodies_[r]) {
        for (const Element& e : alt) {
          if (e.kind != Element::kRule) break;
          left[r].push_back(e.value);
          if (!nullable[e.value]) break;
        }
      }
    }
    std::vector<int> state(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> path;
    for (size_t start = 0; start < n; ++start) {
      if (state[start]) continue;
      path.push_back({static_cast<uint32_t>(start), 0});
      state[start] = 1;
      while (!path.empty()) {
        auto& [r, k] = path.back();
        if (k == left[r].size()) {
          state[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t next = left[r][k++];
        if (state[next] == 1) {
          error("rule '" + g_.names_[next] + "' is left-recursive", defined_at_[next]);
        }
        if (state[next] == 0) {
          state[next] = 1;
          path.push_back({next, 0});
        }
      }
    }
  }
};

Grammar Grammar::parse(std::string_view text) { return Parser(text).run(); }

std::string prefix_rule_names(std::string_view g, std::string_view prefix) {
  std::string out;
  out.reserve(g.size() + g.size() / 4);
  size_t i = 0;
  // Copies up to and including `close`, escapes kept whole.
  auto copy_until = [&](char close) {
    out += g[i++];
    while (i < g.size() && g[i] != close) {
      if (g[i] == '\\' && i + 1 < g.size()) out += g[i++];
      out += g[i++];
    }
    if (i < g.size()) out += g[i++];
  };
  while (i < g.size()) {
    const char c = g[i];
    if (c == '"') {
      copy_until('"');
    } else if (c == '[') {
      copy_until(']');
    } else if (c == '{') {
      copy_until('}');
    } else if (c == '#') {
      while (i < g.size() && g[i] != '\n') out += g[i++];
    } else if (is_name_char(c)) {
      out += prefix;
      while (i < g.size() && is_name_char(g[i])) out += g[i++];
    } else {
      out += g[i++];
    }
  }
  return out;
}

}  // namespace kivi::grammar

// GBNF grammars (llama.cpp's dialect of BNF) compiled to a flat table that the matcher
// walks. A grammar is a set of rules `name ::= alternatives`; the rule `root` is where
// text starts. Elements:
//   "text"        a literal (escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH)
//   [a-z_]        a character class, [^...] its complement (same escapes)
//   .             any character
//   name          a reference to a rule
//   ( ... )       a group; `|` separates alternatives
//   x* x+ x?      repetition; x{m} x{m,} x{m,n} bounded repetition
//   # ...         a comment to the end of the line
// Characters are Unicode code points; the matcher reads UTF-8. Groups and repetitions
// become generated rules, so the table holds only sequences of characters and references.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace kivi::grammar {

// A grammar that does not parse or cannot be matched (an undefined rule, left recursion),
// with where: the byte offset into the text, and its line and column (1-based).
class GrammarError : public Error {
 public:
  GrammarError(const std::string& what, size_t offset, int line, int column);
  size_t offset() const { return offset_; }
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  size_t offset_;
  int line_, column_;
};

struct Element {
  enum Kind : uint8_t {
    kEnd,       // end of an alternative
    kRule,      // a reference: `value` is the rule's index
    kChars,     // a class: ranges [value, value + count) of Grammar::ranges
    kCharsNot,  // the complement of such a class
  };
  Kind kind = kEnd;
  uint32_t value = 0;
  uint32_t count = 0;
};

struct CharRange {
  uint32_t lo = 0, hi = 0;  // inclusive code points
};

class Grammar {
 public:
  // Parses and checks GBNF text; throws GrammarError.
  static Grammar parse(std::string_view text);

  // Element positions of each alternative's first element, per rule.
  const std::vector<std::vector<uint32_t>>& rules() const { return rules_; }
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<CharRange>& ranges() const { return ranges_; }
  const std::string& rule_name(size_t i) const { return names_[i]; }
  uint32_t root() const { return root_; }
  // Whether the class element at `pos` takes code point `cp`.
  bool matches(uint32_t pos, uint32_t cp) const;
  // Whether it takes some code point in [lo, hi] (for a partly read UTF-8 sequence).
  bool matches_some(uint32_t pos, uint32_t lo, uint32_t hi) const;

 private:
  friend class Parser;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<std::string> names_;
  std::vector<Element> elements_;
  std::vector<CharRange> ranges_;
  uint32_t root_ = 0;
};

// The same grammar text with `prefix` before every rule name (definitions and
// references; literals, classes, repetition bounds and comments untouched), so that
// grammars made apart can be joined into one: "root" becomes prefix + "root".
std::string prefix_rule_names(std::string_view gbnf, std::string_view prefix);

}  // namespace kivi::grammar

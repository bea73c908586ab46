// Where a grammar stands after some text: the set of parse stacks that are still alive
// (llama.cpp's approach). A stack lists what is left to match, innermost first; its top
// is always a character class. Stacks are hash-consed linked lists in an arena, so
// pushing, popping and comparing them costs O(1) and equal stacks have equal ids; the
// empty stack (the whole text is a sentence) is kAccept.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/gbnf.h"

namespace kivi::grammar {

class Matcher {
 public:
  using Stacks = std::vector<int32_t>;  // sorted ids, no duplicates
  static constexpr int32_t kAccept = -1;

  // A UTF-8 sequence read in part: its bits so far and how many bytes are still due.
  struct Partial {
    uint32_t cp = 0;
    int left = 0;
    int len = 0;  // the sequence's length in bytes
    bool operator==(const Partial& o) const { return cp == o.cp && left == o.left && len == o.len; }
  };

  explicit Matcher(std::shared_ptr<const Grammar> g);

  // Feeds UTF-8 text (possibly ending inside a character); false, with the state
  // unchanged, when the grammar cannot take it.
  bool accept(std::string_view utf8);
  // The text so far is a whole sentence.
  bool accepting() const;
  // Some character can still follow.
  bool can_continue() const;

  // The pieces the token mask walks with.
  const Stacks& stacks() const { return stacks_; }
  const Partial& partial() const { return partial_; }
  // The stacks after code point cp (empty when none takes it).
  void advance(const Stacks& in, uint32_t cp, Stacks& out);
  // Whether some stack takes a code point in [lo, hi].
  bool takes_some(const Stacks& in, uint32_t lo, uint32_t hi) const;
  // Reads byte b into (stacks, partial); false when the text cannot go on this way.
  bool step_byte(const Stacks& in, const Partial& p, uint8_t b, Stacks& out, Partial& q);
  const Grammar& grammar() const { return *g_; }
  // Nodes in the arena (it is compacted between tokens when it grows large).
  size_t arena_size() const { return nodes_.size(); }
  // Changes when the arena is compacted (stack ids change with it).
  uint32_t epoch() const { return epoch_; }

 private:
  struct Node {
    uint32_t pos;    // the element to match next
    int32_t parent;  // the rest of the stack, or -1
  };
  int32_t intern(uint32_t pos, int32_t parent);
  void expand(uint32_t pos, int32_t parent, Stacks& out, int depth);
  static void normalize(Stacks& s);
  void compact();

  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
  Stacks stacks_;
  Partial partial_;
  Stacks scratch_;
  uint32_t epoch_ = 0;
};

}  // namespace kivi::grammar

// Which tokens a grammar allows next. The vocabulary's texts sit in a byte trie, and
// the mask walks it depth first with the matcher's state: a byte no live stack takes
// prunes the whole subtree, so inside a JSON structure most of the vocabulary is never
// visited, and tokens sharing a prefix share its work. Masks are remembered per state
// (inside a string, the state after each token is the same), and the sampler asks for
// a mask only when the token it would pick is not allowed (see runtime/sampler.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace kivi::grammar {

class VocabTrie {
 public:
  // Every token with text (control, unknown and unused tokens have none and are never
  // allowed by a grammar; end tokens are decided apart). `markup`: the control tokens the
  // vocabulary renders (harmony's <|channel|>, <|message|>, ...) have their text too, so
  // that a grammar can write them; text tokens spelling the same bytes match as well.
  explicit VocabTrie(const tok::Tokenizer& tk, bool markup = false);
  int vocab() const { return vocab_; }
  bool markup() const { return markup_; }
  const std::string& text(int token) const { return texts_[token]; }
  size_t nodes() const { return nodes_.size(); }

 private:
  friend class TokenMask;
  struct Node {
    uint32_t child_begin = 0, child_end = 0;  // into children_
    uint32_t token_begin = 0, token_end = 0;  // into tokens_: tokens ending here
    uint32_t subtree_end = 0;                 // into tokens_: the subtree's tokens end here
    bool ascii = true;                        // every byte below is ASCII
    uint64_t below[2] = {0, 0};               // the ASCII bytes below (a bit set)
  };
  struct Edge {
    uint8_t byte;
    uint32_t node;
  };
  int vocab_ = 0;
  bool markup_ = false;
  std::vector<std::string> texts_;
  std::vector<Node> nodes_;
  std::vector<Edge> children_;
  std::vector<int32_t> tokens_;
};

// One sequence's grammar state and its masks. A set of live stacks is interned as a small
// id; the transitions of ASCII bytes between ids are kept in a table of 256 entries per
// id, and those of whole multi-byte characters in a hash map, both filled as the walks
// meet them: after the first masks, a walk costs one table load per trie node instead
// of a matcher step. (A partly read character is carried beside the id, so the ids stay
// few: the sets of stacks a grammar reaches, not one per byte prefix.)
class TokenMask {
 public:
  // `end_tokens`: the tokens that end the reply; allowed when the text is a sentence.
  TokenMask(std::shared_ptr<const Grammar> g, std::shared_ptr<const VocabTrie> trie,
            std::vector<int> end_tokens);

  // Whether `token` may come next (one walk of its bytes).
  bool allows(int token);
  // allowed[t] for every token of the vocabulary (1 = allowed); masks are kept per state.
  const std::vector<char>& mask();
  // The whole mask computed afresh (no cache of masks), into `out`.
  void compute(std::vector<char>& out);
  // Takes the chosen token; throws kivi::Error when the grammar does not allow it.
  void accept(int token);
  // Takes text the grammar starts from (a lazy grammar's trigger and what followed it);
  // false, with nothing taken, when the grammar refuses it.
  bool accept_text(std::string_view text);
  bool accepting() const { return m_.accepting(); }
  bool can_continue() const { return m_.can_continue(); }
  // Walk states interned so far (for the benchmark).
  size_t states() const { return states_.size(); }

 private:
  static constexpr int32_t kDead = -1, kUnknown = -2;
  struct Pos {
    int32_t state;
    Matcher::Partial partial;
  };
  bool is_end(int token) const;
  int32_t intern(const Matcher::Stacks& stacks);
  // Reads one byte at `pos`; false when the grammar cannot take it.
  bool step(Pos& pos, uint8_t byte);
  int32_t first_byte(int32_t state, uint8_t byte);  // a table entry, computed
  // The ASCII bytes that lead from `state` back to itself (a bit set; computed once).
  const uint64_t* loops(int32_t state);
  Pos current();  // the matcher's state
  void reset_tables();
  void compute_slow(std::vector<char>& out);  // without tables (when they overflow)

  Matcher m_;
  std::shared_ptr<const VocabTrie> trie_;
  std::vector<int> end_;        // sorted
  std::vector<char> end_flag_;  // [vocab] 1 for an end token
  std::vector<Matcher::Stacks> states_;
  // [states][256]: the next id (a lead byte: the same id), kDead or kUnknown.
  std::vector<int32_t> trans_;
  std::vector<uint64_t> loops_;  // [states][3]: the loops' bit set, then 1 once computed
  std::unordered_map<uint64_t, int32_t> char_trans_;  // (id, code point) -> id or kDead
  struct KeyHash {
    size_t operator()(const std::vector<int32_t>& k) const;
  };
  std::unordered_map<std::vector<int32_t>, int32_t, KeyHash> ids_;
  int32_t current_ = kUnknown;  // the matcher's stacks' id, when known
  bool overflow_ = false;       // the tables were reset during a walk
  struct Cached {
    int32_t state;
    std::vector<char> mask;
  };
  std::vector<Cached> cache_;  // most recent last
  std::vector<char> scratch_;  // the last mid-character mask
  uint32_t epoch_ = 0;         // the matcher's epoch the tables belong to
  Matcher::Stacks tmp_;
};

}  // namespace kivi::grammar

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
#include <vector>

#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace kivi::grammar {

class VocabTrie {
 public:
  // Every token with text (control, unknown and unused tokens have none and are never
  // allowed by a grammar; end tokens are decided apart).
  explicit VocabTrie(const tok::Tokenizer& tk);
  int vocab() const { return vocab_; }
  const std::string& text(int token) const { return texts_[token]; }
  size_t nodes() const { return nodes_.size(); }

 private:
  friend class TokenMask;
  struct Node {
    uint32_t child_begin = 0, child_end = 0;  // into children_
    uint32_t token_begin = 0, token_end = 0;  // into tokens_: tokens ending here
  };
  struct Edge {
    uint8_t byte;
    uint32_t node;
  };
  int vocab_ = 0;
  std::vector<std::string> texts_;
  std::vector<Node> nodes_;
  std::vector<Edge> children_;
  std::vector<int32_t> tokens_;
};

// One sequence's grammar state and its masks.
class TokenMask {
 public:
  // `end_tokens`: the tokens that end the reply; allowed when the text is a sentence.
  TokenMask(std::shared_ptr<const Grammar> g, std::shared_ptr<const VocabTrie> trie,
            std::vector<int> end_tokens);

  // Whether `token` may come next (one walk of its bytes).
  bool allows(int token);
  // allowed[t] for every token of the vocabulary (1 = allowed).
  const std::vector<char>& mask();
  // The whole mask computed afresh (no cache), into `out`.
  void compute(std::vector<char>& out);
  // Takes the chosen token; throws kivi::Error when the grammar does not allow it.
  void accept(int token);
  bool accepting() const { return m_.accepting(); }
  bool can_continue() const { return m_.can_continue(); }
  // Full masks computed, and those served from the cache (for the benchmark).
  int masks_computed() const { return computed_; }
  int masks_cached() const { return cached_; }

 private:
  bool is_end(int token) const;

  Matcher m_;
  std::shared_ptr<const VocabTrie> trie_;
  std::vector<int> end_;  // sorted
  struct Cached {
    Matcher::Stacks stacks;
    Matcher::Partial partial;
    std::vector<char> mask;
  };
  std::vector<Cached> cache_;           // most recent last
  uint32_t epoch_ = 0;                  // the matcher's epoch the cache belongs to
  std::vector<Matcher::Stacks> level_;  // the walk's stacks per depth (reused)
  std::vector<Matcher::Partial> part_;
  Matcher::Stacks tmp_;
  int computed_ = 0, cached_ = 0;
};

}  // namespace kivi::grammar

// Prompts of the retrieval tasks as token ids, assembled from pieces encoded apart so
// that their lengths are exact: a header, filler tokens, the hidden item at a depth,
// more filler and a question. Every piece after the first is encoded as it reads in
// the middle of a text (after a space), so splicing gives the tokens a tokenizer
// would give the joined text up to the splice points; the filler is cut at sentence
// or word boundaries where one is near.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kivi::tok {
class Tokenizer;
}

namespace kivi::eval {

struct Prompt {
  std::string task;         // passkey, needle, kv-retrieval
  int ctx = 0;              // requested length in tokens (BOS included)
  double depth = 0.0;       // requested depth of the hidden item: 0 = first, 1 = last
  int trial = 0;            // index among the prompts of the same task, length and depth
  std::vector<int> tokens;  // the prompt as fed (BOS first when the vocabulary wants one)
  std::string expected;     // the answer the generated text must contain
  int item_pos = 0;         // token index where the hidden item starts
  int item_len = 0;         // its tokens
  int answer_tokens = 0;    // tokens of the answer as the model would write it
};

// Tokens of `text` (which starts with a space) as they read after a space in the
// middle of a text: a SentencePiece tokenizer with a dummy prefix encodes the text
// without its space (the dummy prefix gives it back), others encode it whole.
std::vector<int> encode_continuation(const tok::Tokenizer& t, const std::string& text);

// Where a token starts a word (its text begins with a space or follows a newline)
// or a sentence (a word start after a token ending in '.', '!' or '?', possibly
// followed by a closing quote).
bool word_start(const tok::Tokenizer& t, const std::vector<int>& tokens, int i);
bool sentence_start(const tok::Tokenizer& t, const std::vector<int>& tokens, int i);

// A filler text encoded once, read as if repeated without end.
class Haystack {
 public:
  Haystack() = default;
  // Throws when the text encodes to nothing.
  Haystack(const tok::Tokenizer& t, const std::string& text);
  // Tokens [offset, offset + n) of the text repeated.
  std::vector<int> take(int64_t offset, int n) const;
  // The sentence starts of one copy of the text (at least {0}).
  const std::vector<int>& sentences() const { return sentences_; }
  int size() const { return static_cast<int>(unit_.size()); }

 private:
  std::vector<int> unit_;
  std::vector<int> sentences_;
};

// The filler of the passkey test (Mohtashami & Jaggi 2023): "The grass is green. The
// sky is blue. The sun is yellow. Here we go. There and back again."
const char* passkey_filler();

// Tokens allowed short of the requested length when the last filler cut moves back
// to a sentence or word boundary.
inline constexpr int kWordSlack = 16;

// header + filler[0, a) + item + filler[a, b) + question with b chosen so that the
// total is `ctx` tokens (or up to kWordSlack fewer, ending the filler with a sentence,
// else a word) and a the sentence boundary nearest depth * b (else a word boundary,
// else depth * b). `filler` holds at least ctx tokens. Fills tokens and item_pos;
// throws naming `what` and the lengths when the fixed pieces leave no room.
void assemble(const tok::Tokenizer& t, const std::string& what, int ctx, double depth,
              const std::vector<int>& header, const std::vector<int>& filler,
              const std::vector<int>& item, const std::vector<int>& question, Prompt& p);

// A seed for one prompt from the run's seed and the prompt's coordinates.
uint64_t prompt_seed(uint64_t seed, const std::string& task, int ctx, int depth_index, int trial);

}  // namespace kivi::eval

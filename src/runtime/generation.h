// Generation, once for every front end: which tokens end a reply (the stop rule), what
// `ignore_eos` means, sampling, streaming UTF-8 decoding and stop strings. `generate`,
// `chat`, the server's scheduler, Python and eval all go through it, so a reply ends
// the same way whoever asked for it.
//
//   StopRule      the end tokens: EOS, BOS, the vocabulary's end-of-generation set
//                 (<|eot_id|>, <|im_end|>, ...) and a chat format's end marker;
//   Continuation  one sequence's decisions, whatever computes its logits (one session,
//                 a batched step, a no-cache forward): sample, stop or go on, and the
//                 text that can be released now;
//   Generator     a Continuation driving a Session: prefill, then decode step by step.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/token_mask.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/text_stream.h"
#include "tokenizer/tokenizer.h"

namespace kivi::runtime {

class DraftModel;  // runtime/speculative.h

// Where a lazy grammar starts: free text until `word` appears (anywhere, or only as the
// reply's first text after white space when `at_start`), then the grammar from the
// word's first byte on. Empty: the grammar holds from the first token. Text that reaches
// the word but is not a sentence's start leaves the reply free.
struct GrammarTrigger {
  std::string word;
  bool at_start = false;
};

struct GenerationOptions {
  int max_tokens = 256;  // generated tokens at most (the end token not counted); -1 = no limit
  SamplerOptions sampler;
  // The end tokens are never sampled: generation runs to max_tokens (or the context),
  // as llama.cpp's ignore_eos (their logits are -inf).
  bool ignore_eos = false;
  std::vector<std::string> stop;  // stop strings (the text ends before the first one)
  std::vector<int> end_tokens;    // tokens that end the reply besides the vocabulary's own
  // Structured output: the reply's text is a sentence of this grammar. The reply ends
  // when the grammar allows nothing more (or with an end token where it may end); the
  // vocabulary's trie is built once per tokenizer and shared (built here when absent).
  std::shared_ptr<const grammar::Grammar> grammar;
  std::shared_ptr<const grammar::VocabTrie> vocab_trie;
  GrammarTrigger trigger;  // a lazy grammar (tool calls in free text)
  // The grammar writes the markup tokens the vocabulary renders (harmony's tool calls):
  // the vocabulary trie must hold them (grammar::VocabTrie's `markup`).
  bool grammar_markup = false;
  // Speculative decoding by prompt lookup (a Generator's; runtime/speculative.h): each
  // step drafts up to `lookup` tokens (0 = off) that followed the latest earlier
  // occurrence of the last `lookup_ngram` (down to 1) tokens and verifies them in one
  // batched forward. The tokens are those plain decoding gives.
  int lookup = 0;
  int lookup_ngram = 3;
  // With a draft model, the drafts (still up to `lookup` tokens) are its greedy
  // continuation instead of a lookup. Not owned; outlives the generation.
  DraftModel* draft_model = nullptr;
};

class StopRule {
 public:
  StopRule(const tok::Tokenizer& tk, std::vector<int> extra = {});
  bool ends(int token) const;
  // Every end token of the vocabulary, in increasing order.
  std::vector<int> all(int vocab) const;

 private:
  const tok::Tokenizer& tk_;
  std::vector<int> extra_;
};

enum class StopReason { kNone, kEnd, kStopString, kLength, kContext, kInterrupted };
// "" (running), "eos", "stop", "length", "context", "interrupted".
const char* stop_reason_name(StopReason r);

class Continuation {
 public:
  struct Step {
    int token = -1;    // the token chosen (-1 when an end token stopped the reply)
    std::string text;  // text released by this step (possibly empty)
    bool done = false;
    StopReason reason = StopReason::kNone;
  };

  // `prev` is the token before the first generated one (for SentencePiece's leading space).
  Continuation(const tok::Tokenizer& tk, const GenerationOptions& o, int prev);

  // Chooses the next token from logits[vocab]. After a step with done = true, no more.
  Step next(const float* logits);
  // Ends the reply from outside (the context is full): releases what is held.
  Step end(StopReason r);
  bool done() const { return reason_ != StopReason::kNone; }
  StopReason reason() const { return reason_; }
  int generated() const { return n_generated_; }
  const std::string& text() const { return text_.text(); }
  const GenerationOptions& options() const { return o_; }
  Sampler& sampler() { return sampler_; }

 private:
  struct MaskFilter : TokenFilter {
    grammar::TokenMask* m = nullptr;
    bool allows(int token) override { return m->allows(token); }
    const std::vector<char>& mask() override { return m->mask(); }
  };
  const tok::Tokenizer& tk_;
  GenerationOptions o_;
  StopRule rule_;
  Sampler sampler_;
  tok::StreamDecoder decoder_;
  TextStream text_;
  void start_grammar(size_t at);
  void watch_trigger(int token);

  std::unique_ptr<grammar::TokenMask> mask_;
  MaskFilter filter_;
  std::shared_ptr<const grammar::VocabTrie> trie_;
  bool waiting_ = false;  // a lazy grammar not started yet
  std::string raw_;       // the tokens' texts while waiting
  size_t searched_ = 0;   // raw_ before this holds no trigger
  int n_generated_ = 0;
  StopReason reason_ = StopReason::kNone;
};

// A Continuation over a Session. The session's cache may already hold tokens (a loaded
// KV file, earlier chat turns); the prompt is appended after them.
class Generator {
 public:
  // `bounded`: the session's overflow policy makes room when the context is full;
  // otherwise the reply ends with StopReason::kContext when the next token has no room.
  Generator(Session& s, const GenerationOptions& o, int prev_token);
  // Feeds the prompt (may be empty when the cache already holds the tokens whose logits
  // are passed as `logits`).
  void prefill(const std::vector<int>& prompt);
  void set_logits(const float* logits) { logits_ = logits; }
  // One token: decodes the previous one if needed, then chooses the next.
  Continuation::Step next();
  // Whether the reply has ended and every step of it was returned by next().
  bool done() const { return ready_.empty() && cont_.done(); }
  // Feeds the last chosen token when the reply ended with it unfed (max_tokens, a stop
  // string), so the cache holds the whole reply (chat turns); nothing when there is no room.
  void feed_pending();
  Continuation& continuation() { return cont_; }
  // The last chosen token when it is not in the cache yet, else -1.
  int pending() const { return pending_; }
  // Decode steps run (forward passes after the prefill; a verification is one).
  int decode_steps() const { return decode_steps_; }
  // Speculation so far: verifications, tokens drafted and drafts accepted.
  struct Speculation {
    int rounds = 0;
    int drafted = 0;
    int accepted = 0;
  };
  const Speculation& speculation() const { return spec_; }

 private:
  // One verification of a drafted run (runtime/speculative.cpp); false when there is no
  // draft, and the step is a plain one.
  bool verify_drafts();

  Session& s_;
  Continuation cont_;
  const float* logits_ = nullptr;
  int pending_ = -1;  // a chosen token not yet fed
  int decode_steps_ = 0;
  bool bounded_;
  // Speculation: the text so far (lookup's haystack), steps verified but not yet
  // returned, and the logits of a verification.
  Speculation spec_;
  int draft_length_ = 0;  // the next draft's length at most (0: not started)
  std::vector<int> history_;
  std::deque<Continuation::Step> ready_;
  std::vector<float> all_logits_;
};

}  // namespace kivi::runtime

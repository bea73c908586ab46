// Speculative decoding: a cheap guess of the next tokens is checked by the model in one
// batched forward instead of one forward per token. The guess comes from prompt lookup
// (as llama.cpp's lookup decoding and vLLM's n-gram drafting: text that copies from
// earlier text, such as code edits, quotes, summaries or a repeated phrase, is guessed
// from where it occurred before) or from a small draft model of the same vocabulary
// (DraftModel: its greedy continuation).
//
// A step: the last n tokens (n = lookup_ngram down to 2) are looked up in the text so
// far; the tokens that followed their latest earlier occurrence are the draft. The
// chosen-but-unfed token and the draft are fed together (Session::verify: the logits of
// every position, each as decoding would give it), and the Continuation chooses from each
// position's logits in turn while its choice equals the draft's next token; the first other choice
// ends the step, and the cache is cut back to the tokens kept (Session::truncate). Batched logits
// equal one-token logits bit for bit (model/forward.h), and the Continuation draws exactly as it
// would one token at a time, so greedy and sampled text are those plain decoding gives: a draft
// only saves forwards. (For a deterministic draft this is the standard acceptance rule: a draft
// token is kept with the target's probability of it, and on a rejection the token comes from the
// target's distribution without it.)
#pragma once

#include <memory>
#include <vector>

#include "runtime/generation.h"
#include "runtime/session.h"

namespace kivi::runtime {

// A draft model: a smaller model of the target's vocabulary, with a session (and cache
// format) of its own, that drafts its greedy continuation of the text so far. Its cache
// follows the text: each draft cuts it back to what the text shares with what it fed,
// and feeds the rest.
class DraftModel {
 public:
  // Throws kivi::Error when the vocabularies differ (size, special tokens or any piece).
  // `o.rewind` is raised to `max_tokens` (rejected drafts are cut back).
  DraftModel(std::shared_ptr<const model::Model> draft, const model::Model& target,
             SessionOptions o, int max_tokens);
  // Up to n (<= max_tokens) tokens continuing `text` (not empty), greedily.
  std::vector<int> draft(const std::vector<int>& text, int n);
  const model::Model& model() const { return *m_; }
  const std::shared_ptr<const model::Model>& shared_model() const { return m_; }
  int max_tokens() const { return max_tokens_; }
  const SessionOptions& options() const { return s_->options(); }
  Session& session() { return *s_; }

 private:
  std::shared_ptr<const model::Model> m_;  // shared by the server's slots' drafts
  std::unique_ptr<Session> s_;
  std::vector<int> fed_;  // the tokens in the draft's cache
  int max_tokens_;
};

// Up to `max_tokens` tokens that followed the latest earlier occurrence of the last n
// tokens of `text`, for the largest n from `ngram` down to `min_ngram` that has one;
// empty when none has.
std::vector<int> lookup_draft(const std::vector<int>& text, int ngram, int max_tokens,
                              int min_ngram = 1);

// The next draft for `text`, at most n tokens: the draft model's continuation when there
// is one, else a lookup of its last `ngram` tokens (down to 2, or 1 when ngram is 1: a
// one-token match drafts noise).
std::vector<int> make_draft(DraftModel* model, const std::vector<int>& text, int ngram, int n);

// The Continuation chooses from the logits of each verified position in turn (rows
// [0, draft.size()] of `logits`, `vocab` apart) while its choice equals the draft's next
// token; each step is appended to *steps. Returns the drafts accepted (steps - 1); the last
// step's token is the one not fed yet.
int accept_drafts(Continuation& c, const float* logits, size_t vocab, const std::vector<int>& draft,
                  std::vector<Continuation::Step>* steps);

// The draft length of the next step from the last one's: twice as long after a draft
// that held whole (up to `max`), one past the accepted tokens after a partial one, half
// after none held (down to 1): a step costs little more than a plain one where copies
// stop, and drafts long runs where they go on.
int next_draft_length(int length, int drafted, int accepted, int max);

}  // namespace kivi::runtime

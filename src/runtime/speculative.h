// Speculative decoding by prompt lookup (as llama.cpp's lookup decoding and vLLM's n-gram
// drafting): text that copies from earlier text (code edits, quotes, summaries, a
// repeated phrase) is guessed from where it occurred before, and the guess is checked by
// the model in one batched forward instead of one forward per token.
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

#include <vector>

namespace kivi::runtime {

// Up to `max_tokens` tokens that followed the latest earlier occurrence of the last n
// tokens of `text`, for the largest n from `ngram` down to `min_ngram` that has one;
// empty when none has.
std::vector<int> lookup_draft(const std::vector<int>& text, int ngram, int max_tokens,
                              int min_ngram = 1);

// The draft length of the next step from the last one's: twice as long after a draft
// that held whole (up to `max`), one past the accepted tokens after a partial one, half
// after none held (down to 1): a step costs little more than a plain one where copies
// stop, and drafts long runs where they go on.
int next_draft_length(int length, int drafted, int accepted, int max);

}  // namespace kivi::runtime

#include "runtime/generation.h"

#include <algorithm>

#include "core/error.h"

namespace kivi::runtime {

StopRule::StopRule(const tok::Tokenizer& tk, std::vector<int> extra)
    : tk_(tk), extra_(std::move(extra)) {}

bool StopRule::ends(int token) const {
  return token == tk_.eos_id() || token == tk_.bos_id() || tk_.is_end_of_generation(token) ||
         std::find(extra_.begin(), extra_.end(), token) != extra_.end();
}

std::vector<int> StopRule::all(int vocab) const {
  std::vector<int> out;
  for (int t = 0; t < vocab; ++t) {
    if (ends(t)) out.push_back(t);
  }
  return out;
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kNone:
      return "";
    case StopReason::kEnd:
      return "eos";
    case StopReason::kStopString:
      return "stop";
    case StopReason::kLength:
      return "length";
    case StopReason::kContext:
      return "context";
    case StopReason::kInterrupted:
      return "interrupted";
  }
  return "";
}

Continuation::Continuation(const tok::Tokenizer& tk, const GenerationOptions& o, int prev)
    : tk_(tk),
      o_(o),
      rule_(tk, o.end_tokens),
      sampler_(o.sampler, tk.vocab_size()),
      decoder_(tk, prev),
      text_(o.stop) {
  if (o.max_tokens < -1) fail("max_tokens = %d, expected -1 (no limit) or more", o.max_tokens);
  if (o.ignore_eos) sampler_.ban(rule_.all(tk.vocab_size()));
  if (o.max_tokens == 0) reason_ = StopReason::kLength;
  if (o.grammar) {
    trie_ = o.vocab_trie && o.vocab_trie->markup() == o.grammar_markup
                ? o.vocab_trie
                : std::make_shared<const grammar::VocabTrie>(tk, o.grammar_markup);
    if (trie_->vocab() != tk.vocab_size())
      fail("internal: the grammar's vocabulary trie is of another tokenizer");
    if (o.trigger.word.empty()) {
      start_grammar(0);
    } else {
      waiting_ = true;
    }
  }
}

void Continuation::start_grammar(size_t at) {
  mask_ = std::make_unique<grammar::TokenMask>(o_.grammar, trie_, rule_.all(tk_.vocab_size()));
  waiting_ = false;
  if (at < raw_.size() && !mask_->accept_text(std::string_view(raw_).substr(at))) {
    mask_.reset();  // not a sentence's start: the reply stays free
    return;
  }
  filter_.m = mask_.get();
}

void Continuation::watch_trigger(int token) {
  raw_ += trie_->text(token);
  const std::string& w = o_.trigger.word;
  if (o_.trigger.at_start) {
    const size_t b = raw_.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return;
    const size_t n = std::min(w.size(), raw_.size() - b);
    if (raw_.compare(b, n, w, 0, n) != 0) {
      waiting_ = false;  // the reply starts otherwise
    } else if (n == w.size()) {
      start_grammar(b);
    }
    return;
  }
  const size_t at = raw_.find(w, searched_);
  if (at != std::string::npos) {
    start_grammar(at);
  } else if (raw_.size() >= w.size()) {
    searched_ = raw_.size() - w.size() + 1;
  }
}

Continuation::Step Continuation::end(StopReason r) {
  Step s;
  if (done()) return s;
  s.text = text_.push(decoder_.flush()) + text_.finish();
  s.done = true;
  s.reason = reason_ = r;
  return s;
}

Continuation::Step Continuation::next(const float* logits) {
  if (done()) fail("internal: generation continued after it ended");
  const int token = sampler_.sample(logits, mask_ ? &filter_ : nullptr);
  // No token left (a finished grammar whose end tokens are banned) ends the reply too.
  if (token < 0 || rule_.ends(token)) return end(StopReason::kEnd);
  if (mask_) {
    mask_->accept(token);
  } else if (waiting_) {
    watch_trigger(token);
  }
  sampler_.accept(token);
  Step s;
  s.token = token;
  ++n_generated_;
  s.text = text_.push(decoder_.push(token));
  if (text_.stopped()) {
    s.done = true;
    s.reason = reason_ = StopReason::kStopString;
  } else if ((o_.max_tokens >= 0 && n_generated_ >= o_.max_tokens) ||
             (mask_ && !mask_->can_continue())) {
    // A grammar that takes nothing more ends the reply without another forward step.
    const Step rest = end(mask_ && !mask_->can_continue() ? StopReason::kEnd : StopReason::kLength);
    s.text += rest.text;
    s.done = true;
    s.reason = rest.reason;
  }
  return s;
}

namespace {

// The options with the model's vocabulary trie when a grammar needs one.
GenerationOptions with_trie(const Session& s, const GenerationOptions& o) {
  GenerationOptions out = o;
  if (out.grammar && !out.vocab_trie) out.vocab_trie = s.model().vocab_trie(out.grammar_markup);
  return out;
}

}  // namespace

Generator::Generator(Session& s, const GenerationOptions& o, int prev_token)
    : s_(s),
      cont_(s.model().tokenizer(), with_trie(s, o), prev_token),
      bounded_(s.options().overflow != ContextOverflow::kStop) {
  if (o.lookup < 0 || o.lookup > 64) fail("--lookup %d: expected 0 to 64 tokens", o.lookup);
  if (o.lookup_ngram < 1 || o.lookup_ngram > 16)
    fail("--lookup-ngram %d: expected 1 to 16 tokens", o.lookup_ngram);
  if (o.lookup > s.options().rewind) {
    fail("--lookup %d: the session can cut back %d tokens (SessionOptions::rewind)", o.lookup,
         s.options().rewind);
  }
}

void Generator::prefill(const std::vector<int>& prompt) {
  if (prompt.empty()) {
    if (!logits_) fail("internal: generation without a prompt or logits");
    return;
  }
  if (!bounded_ && s_.pos() + static_cast<int>(prompt.size()) > s_.ctx()) {
    fail("the prompt of %zu tokens does not fit the %d tokens left in the context of %d",
         prompt.size(), s_.ctx() - s_.pos(), s_.ctx());
  }
  cont_.sampler().observe_prompt(prompt);
  logits_ = s_.prefill(prompt);
  if (cont_.options().lookup > 0) history_.insert(history_.end(), prompt.begin(), prompt.end());
}

Continuation::Step Generator::next() {
  if (ready_.empty() && !cont_.done() && pending_ >= 0 && cont_.options().lookup > 0)
    verify_drafts();
  if (!ready_.empty()) {
    const Continuation::Step st = ready_.front();
    ready_.pop_front();
    return st;
  }
  if (cont_.done()) {
    Continuation::Step s;
    s.done = true;
    s.reason = cont_.reason();
    return s;
  }
  if (pending_ >= 0) {
    if (!bounded_ && s_.pos() >= s_.ctx()) return cont_.end(StopReason::kContext);
    logits_ = s_.decode(pending_);
    ++decode_steps_;
    pending_ = -1;
  }
  Continuation::Step step = cont_.next(logits_);
  pending_ = step.token;
  if (cont_.options().lookup > 0 && step.token >= 0) history_.push_back(step.token);
  return step;
}

void Generator::feed_pending() {
  if (pending_ < 0 || (!bounded_ && s_.pos() >= s_.ctx())) return;
  logits_ = s_.decode(pending_);
  ++decode_steps_;
  pending_ = -1;
}

}  // namespace kivi::runtime

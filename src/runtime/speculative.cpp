#include "runtime/speculative.h"

#include <algorithm>

#include "core/error.h"
#include "model/model.h"
#include "runtime/generation.h"

namespace kivi::runtime {

namespace {

// The first difference between two tokenizers' vocabularies, or "" when they agree.
std::string vocabulary_difference(const tok::Tokenizer& a, const tok::Tokenizer& b) {
  if (a.vocab_size() != b.vocab_size())
    return strfmt("%d tokens in the draft, %d in the model", a.vocab_size(), b.vocab_size());
  if (a.bos_id() != b.bos_id() || a.eos_id() != b.eos_id())
    return strfmt("BOS/EOS %d/%d in the draft, %d/%d in the model", a.bos_id(), a.eos_id(),
                  b.bos_id(), b.eos_id());
  for (int t = 0; t < a.vocab_size(); ++t) {
    if (a.piece(t) != b.piece(t))
      return strfmt("token %d is '%s' in the draft, '%s' in the model", t, a.piece(t).c_str(),
                    b.piece(t).c_str());
  }
  return "";
}

}  // namespace

DraftModel::DraftModel(std::shared_ptr<const model::Model> d, const model::Model& target,
                       SessionOptions o, int max_tokens)
    : m_(std::move(d)), max_tokens_(max_tokens) {
  const model::Model& draft = *m_;
  const std::string diff = vocabulary_difference(draft.tokenizer(), target.tokenizer());
  if (!diff.empty())
    fail("--draft-model %s: not the model's vocabulary (%s)", draft.path().c_str(), diff.c_str());
  if (draft.config().vocab_size != target.config().vocab_size)
    fail("--draft-model %s: %d logits per token, the model has %d", draft.path().c_str(),
         draft.config().vocab_size, target.config().vocab_size);
  if (max_tokens < 1 || max_tokens > 64)
    fail("--draft-max %d: expected 1 to 64 tokens", max_tokens);
  o.rewind = std::max(o.rewind, max_tokens);
  s_ = std::make_unique<Session>(draft, o);
}

std::vector<int> DraftModel::draft(const std::vector<int>& text, int n) {
  if (text.empty()) fail("internal: a draft of no text");
  n = std::min(n, max_tokens_);
  // Room for the text and n - 1 drafted tokens fed.
  if (static_cast<int>(text.size()) + n - 1 > s_->ctx())
    n = s_->ctx() + 1 - static_cast<int>(text.size());
  if (n < 1) return {};
  // Keep what the cache shares with the text, short of the text's last token (whose
  // logits the draft starts from).
  size_t keep = 0;
  const size_t limit = std::min(fed_.size(), text.size() - 1);
  while (keep < limit && fed_[keep] == text[keep]) ++keep;
  if (keep < fed_.size()) {
    if (keep == 0 || static_cast<int>(fed_.size() - keep) > s_->options().rewind) {
      s_->reset();
      keep = 0;
    } else {
      s_->truncate(static_cast<int>(keep));
    }
    fed_.resize(keep);
  }
  const float* logits = s_->prefill(std::vector<int>(text.begin() + keep, text.end()));
  fed_.insert(fed_.end(), text.begin() + keep, text.end());
  std::vector<int> out;
  const int V = m_->config().vocab_size;
  for (int i = 0; i < n; ++i) {
    out.push_back(argmax(logits, V));
    if (i + 1 == n) break;
    logits = s_->decode(out.back());
    fed_.push_back(out.back());
  }
  return out;
}

std::vector<int> lookup_draft(const std::vector<int>& text, int ngram, int max_tokens,
                              int min_ngram) {
  const int n_text = static_cast<int>(text.size());
  for (int n = std::min(ngram, n_text - 1); n >= std::max(1, min_ngram); --n) {
    const int* tail = text.data() + n_text - n;
    // The latest occurrence that ends before the tail starts... or overlaps it: a
    // repeated token run drafts its own continuation.
    for (int start = n_text - n - 1; start >= 0; --start) {
      if (!std::equal(tail, tail + n, text.data() + start)) continue;
      const int from = start + n;
      const int count = std::min(max_tokens, n_text - from);
      return std::vector<int>(text.begin() + from, text.begin() + from + count);
    }
  }
  return {};
}

std::vector<int> make_draft(DraftModel* model, const std::vector<int>& text, int ngram, int n) {
  return model ? model->draft(text, n) : lookup_draft(text, ngram, n, std::min(2, ngram));
}

int accept_drafts(Continuation& c, const float* logits, size_t vocab, const std::vector<int>& draft,
                  std::vector<Continuation::Step>* steps) {
  for (size_t j = 0;; ++j) {
    steps->push_back(c.next(logits + j * vocab));
    const Continuation::Step& st = steps->back();
    if (st.done || j == draft.size() || st.token != draft[j]) return static_cast<int>(j);
  }
}

int next_draft_length(int length, int drafted, int accepted, int max) {
  if (accepted == drafted) return std::min(max, 2 * length);
  if (accepted == 0) return std::max(1, length / 2);
  return std::min(max, accepted + 1);
}

bool Generator::verify_drafts() {
  const GenerationOptions& o = cont_.options();
  if (draft_length_ == 0) draft_length_ = o.lookup;
  // Room in the context for the pending token and the draft, and no drafting past the
  // reply's last token.
  int room = s_.ctx() - s_.pos() - 1;
  if (o.max_tokens >= 0) room = std::min(room, o.max_tokens - cont_.generated());
  if (room < 1) return false;
  const std::vector<int> draft =
      make_draft(o.draft_model, history_, o.lookup_ngram, std::min(draft_length_, room));
  if (draft.empty()) return false;
  const int n0 = s_.pos();
  std::vector<int> feed = {pending_};
  feed.insert(feed.end(), draft.begin(), draft.end());
  const size_t V = static_cast<size_t>(s_.vocab());
  all_logits_.resize(feed.size() * V);
  s_.verify(feed, all_logits_.data());
  ++decode_steps_;
  std::vector<Continuation::Step> steps;
  const int j = accept_drafts(cont_, all_logits_.data(), V, draft, &steps);
  for (const Continuation::Step& st : steps) {
    ready_.push_back(st);
    if (st.token >= 0) history_.push_back(st.token);
  }
  pending_ = steps.back().token;
  ++spec_.rounds;
  spec_.drafted += static_cast<int>(draft.size());
  spec_.accepted += j;
  // The cache keeps the pending token and the accepted drafts; the last choice is fed
  // by the next step.
  s_.truncate(n0 + j + 1);
  draft_length_ = next_draft_length(draft_length_, static_cast<int>(draft.size()), j, o.lookup);
  logits_ = nullptr;
  return true;
}

}  // namespace kivi::runtime

#include "runtime/speculative.h"

#include <algorithm>

#include "runtime/generation.h"

namespace kivi::runtime {

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

int next_draft_length(int length, int drafted, int accepted, int max) {
  if (accepted == drafted) return std::min(max, 2 * length);
  if (accepted == 0) return std::max(1, length / 2);
  return std::min(max, accepted + 1);
}

bool Generator::verify_drafts() {
  const GenerationOptions& o = cont_.options();
  if (draft_length_ == 0) draft_length_ = o.lookup;
  // One-token matches draft noise: two at least (one when --lookup-ngram is 1).
  std::vector<int> draft =
      lookup_draft(history_, o.lookup_ngram, draft_length_, std::min(2, o.lookup_ngram));
  // Room in the context for the pending token and the draft, and no drafting past the
  // reply's last token.
  int room = s_.ctx() - s_.pos() - 1;
  if (o.max_tokens >= 0) room = std::min(room, o.max_tokens - cont_.generated());
  if (room < 1 || draft.empty()) return false;
  if (static_cast<int>(draft.size()) > room) draft.resize(static_cast<size_t>(room));
  const int n0 = s_.pos();
  std::vector<int> feed = {pending_};
  feed.insert(feed.end(), draft.begin(), draft.end());
  const size_t V = static_cast<size_t>(s_.vocab());
  all_logits_.resize(feed.size() * V);
  s_.verify(feed, all_logits_.data());
  ++decode_steps_;
  ++spec_.rounds;
  spec_.drafted += static_cast<int>(draft.size());
  pending_ = -1;
  size_t j = 0;
  for (;; ++j) {
    const Continuation::Step st = cont_.next(all_logits_.data() + j * V);
    ready_.push_back(st);
    if (st.token >= 0) history_.push_back(st.token);
    if (st.done || j == draft.size() || st.token != draft[j]) {
      pending_ = st.token;
      break;
    }
    ++spec_.accepted;
  }
  // The cache keeps the pending token and the accepted drafts; the last choice is fed
  // by the next step.
  s_.truncate(n0 + static_cast<int>(j) + 1);
  draft_length_ = next_draft_length(draft_length_, static_cast<int>(draft.size()),
                                    static_cast<int>(j), o.lookup);
  logits_ = nullptr;
  return true;
}

}  // namespace kivi::runtime

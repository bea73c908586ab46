// Speculative decoding in the scheduler's steps (runtime/scheduler.h, runtime/speculative.h):
// a decoding sequence feeds its pending token and a draft (a lookup, or its slot's draft
// model's greedy continuation) in one row group of the
// step, whose every row's logits equal decoding's (model::BatchSequence::all_logits); its
// Continuation chooses from them in turn while it agrees with the draft, and the cache is
// cut back to the tokens kept.
#include <algorithm>

#include "core/error.h"
#include "runtime/scheduler.h"
#include "runtime/speculative.h"

namespace kivi::runtime {

int Scheduler::plan_draft(int i) {
  Slot& s = slots_[i];
  if (s.draft_length == 0) s.draft_length = opt_.lookup;
  // Room after the pending token in the context, and no drafting past max_tokens.
  const int room = std::min(opt_.ctx - s.fed - 1, s.params.max_tokens - s.n_generated);
  if (room < 1) return 0;
  s.draft =
      make_draft(s.drafter.get(), s.tokens, opt_.lookup_ngram, std::min(s.draft_length, room));
  const int d = static_cast<int>(s.draft.size());
  if (d == 0) return 0;
  // The draft's blocks, if the pool has them (a draft never preempts anyone).
  const bool ok = s.cache->reserve(s.fed + 1 + d);
  note({kReserve, i, s.fed + 1 + d, ok ? 1 : 0});
  if (!ok) return 0;
  s.feed.assign(1, s.tokens[s.fed]);
  s.feed.insert(s.feed.end(), s.draft.begin(), s.draft.end());
  const size_t need = static_cast<size_t>(1 + opt_.lookup) * m_.config().vocab_size;
  if (s.all_logits.size() < need) s.all_logits.reset(need, false);
  return d;
}

void Scheduler::verify(int i, int rows) {
  Slot& s = slots_[i];
  const int n0 = s.fed, d = rows - 1;
  const size_t V = static_cast<size_t>(m_.config().vocab_size);
  std::vector<Continuation::Step> steps;
  int j = 0;
  try {
    j = accept_drafts(*s.gen, s.all_logits.data(), V, s.draft, &steps);
  } catch (const Error& e) {  // a grammar that cannot go on (too ambiguous)
    s.fed = n0 + rows;
    end(s, FinishReason::kError, e.what());
    return;
  }
  // The cache keeps the pending token and the accepted drafts; the last choice is fed by
  // the next step. No block past n0 is published yet, so the cut back copies none.
  const int keep = n0 + 1 + j;
  if (keep < n0 + rows) {
    if (!s.cache->truncate(keep)) {
      s.fed = n0 + rows;
      end(s, FinishReason::kError, "internal: a verified draft could not be cut back");
      return;
    }
    note({kTruncate, i, keep});
  }
  s.fed = keep;
  // Publish the full blocks under the tokens they hold (the accepted drafts included).
  s.tokens.insert(s.tokens.end(), s.draft.begin(), s.draft.begin() + j);
  s.cache->publish(s.tokens.data());
  s.tokens.resize(static_cast<size_t>(n0) + 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.spec_verifications;
    stats_.spec_drafted += static_cast<uint64_t>(d);
    stats_.spec_accepted += static_cast<uint64_t>(j);
  }
  s.draft_length = next_draft_length(s.draft_length, d, j, opt_.lookup);
  for (size_t k = 0; k < steps.size() && s.active(); ++k) {
    emit(s, steps[k], s.all_logits.data() + k * V);
  }
}

}  // namespace kivi::runtime

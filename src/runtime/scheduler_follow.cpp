// Repeating a leader's steps on other ranks (runtime/step_link.h): the leader records
// every cache operation in the order it makes it and sends the record before each
// batched step; a follower applies the same operations to its own pool and runs the
// same step, so that the collectives inside the forward pass meet on every rank.
#include <cstring>

#include "core/error.h"
#include "runtime/scheduler.h"

namespace kivi::runtime {

void Scheduler::start() {
  if (!opt_.link || !opt_.link->leader())
    fail("Scheduler::start is for the leader of linked schedulers");
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
}

void Scheduler::note(std::initializer_list<int32_t> words) {
  if (opt_.link) record_.insert(record_.end(), words);
}

void Scheduler::note_tokens(const int* tokens, int n) {
  if (opt_.link) record_.insert(record_.end(), tokens, tokens + n);
}

void Scheduler::send_record() {
  opt_.link->exchange(record_);
  record_.clear();
}

namespace {

// Reads a record word by word; a record that ends early or names a slot that does not
// exist is an error (it cannot come from a leader with the same options).
struct Reader {
  const std::vector<int32_t>& w;
  size_t& i;
  int32_t next() {
    if (i >= w.size()) fail("serving over ranks: a step record ends early");
    return w[i++];
  }
  int slot(int n_slots) {
    const int32_t s = next();
    if (s < 0 || s >= n_slots) fail("serving over ranks: a step record names slot %d", s);
    return s;
  }
  const int* tokens(int n) {
    if (n < 0 || w.size() - i < static_cast<size_t>(n))
      fail("serving over ranks: a step record ends early");
    const int* p = reinterpret_cast<const int*>(w.data() + i);
    i += static_cast<size_t>(n);
    return p;
  }
};

}  // namespace

void Scheduler::repeat_step(const std::vector<int32_t>& w, size_t& i) {
  Reader r{w, i};
  const int n_seqs = r.next();
  if (n_seqs < 1 || n_seqs > static_cast<int>(batch_.size()))
    fail("serving over ranks: a step of %d sequences", n_seqs);
  for (int j = 0; j < n_seqs; ++j) {
    const int slot = r.slot(static_cast<int>(slots_.size()));
    Slot& s = slots_[slot];
    const int fed = r.next(), n = r.next(), logits = r.next();
    if (fed < 0 || fed > opt_.ctx) fail("serving over ranks: a step at position %d", fed);
    const int* t = r.tokens(n);
    if (s.tokens.size() < static_cast<size_t>(fed + n)) s.tokens.resize(fed + n);
    std::memcpy(s.tokens.data() + fed, t, sizeof(int) * static_cast<size_t>(n));
    batch_[j] = {s.cache.get(), s.tokens.data() + fed, n, logits ? s.logits.data() : nullptr};
    batch_slot_[j] = slot;
  }
  try {
    fwd_->run(m_, batch_.data(), n_seqs, &pool_, opt_.forward);
  } catch (const Error&) {
    // The leader's step failed the same way (the checks come before any collective);
    // it ends those sequences, and the next record clears them here.
    return;
  }
  for (int j = 0; j < n_seqs; ++j) {
    Slot& s = slots_[batch_slot_[j]];
    s.cache->publish(s.tokens.data());
  }
}

void Scheduler::follow() {
  if (!opt_.link || opt_.link->leader())
    fail("Scheduler::follow is for the followers of linked schedulers");
  std::vector<int32_t> w;
  const int n_slots = static_cast<int>(slots_.size());
  for (;;) {
    opt_.link->exchange(w);
    size_t i = 0;
    Reader r{w, i};
    while (i < w.size()) {
      switch (r.next()) {
        case kShare: {
          Slot& s = slots_[r.slot(n_slots)];
          const int n = r.next();
          const int* t = r.tokens(n);
          s.tokens.assign(t, t + n);
          const int shared = s.cache->share_prefix(s.tokens.data(), n);
          const int expected = r.next();
          if (shared != expected) {
            fail("serving over ranks: this rank shares %d prefix blocks where the leader shares %d",
                 shared, expected);
          }
          s.cache->assume_shared(r.next());
          break;
        }
        case kReserve: {
          Slot& s = slots_[r.slot(n_slots)];
          const int n = r.next();
          const bool expected = r.next() != 0;
          if (s.cache->reserve(n) != expected) {
            fail("serving over ranks: this rank's block pool %s %d tokens where the leader's %s",
                 expected ? "cannot reserve" : "reserves", n, expected ? "does" : "cannot");
          }
          break;
        }
        case kClear: {
          Slot& s = slots_[r.slot(n_slots)];
          s.cache->clear();
          s.tokens.clear();
          break;
        }
        case kKeep:
          slots_[r.slot(n_slots)].cache->release_reservation();
          break;
        case kTruncate: {
          Slot& s = slots_[r.slot(n_slots)];
          const int n = r.next();
          if (!s.cache->can_truncate(n) || !s.cache->truncate(n))
            fail("serving over ranks: this rank cannot cut a cache back to %d tokens", n);
          break;
        }
        case kStep:
          repeat_step(w, i);
          break;
        case kStop:
          return;
        default:
          fail("serving over ranks: unknown operation %d in a step record", w[i - 1]);
      }
    }
  }
}

}  // namespace kivi::runtime

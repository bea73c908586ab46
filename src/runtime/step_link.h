// The steps of a serving scheduler, repeated by other processes. Under tensor
// parallelism (--dist tp) every rank holds a share of each weight and of each sequence's
// cache, so every rank must run the same batched steps over the same cache operations
// (admissions, prefix sharing, reservations, releases). The leader's scheduler records
// them and sends one record per step; each follower's scheduler receives the records
// and repeats them in order (Scheduler::follow).
#pragma once

#include <cstdint>
#include <vector>

namespace kivi::runtime {

class StepLink {
 public:
  virtual ~StepLink() = default;
  // The leader sends `words` to every follower; a follower receives the leader's next
  // words into `words`. A follower waiting for the next step sleeps rather than spins
  // once the leader has been idle for a moment.
  virtual void exchange(std::vector<int32_t>& words) = 0;
  virtual bool leader() const = 0;
};

}  // namespace kivi::runtime

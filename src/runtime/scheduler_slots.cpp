// Slots (runtime/scheduler.h): what each holds, and the cache an ended request left in
// one saved to, restored from or erased as a KV file (runtime/session_file.h). The
// operations run on the scheduler's thread between steps.
#include <future>

#include "core/timer.h"
#include "runtime/scheduler.h"
#include "runtime/session_file.h"

namespace kivi::runtime {

std::vector<Scheduler::SlotInfo> Scheduler::slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slot_info_;
}

void Scheduler::on_loop(const std::function<void()>& f) {
  // The slots' list is published before the caller hears back, so that a GET /slots
  // after a save, restore or erase sees what it did.
  auto task = std::make_shared<std::packaged_task<void()>>([this, &f] {
    f();
    publish_stats();
  });
  std::future<void> done = task->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw SlotError(SlotError::kOff, "the server is stopping");
    commands_.push_back([task] { (*task)(); });
  }
  cv_.notify_all();
  done.get();
}

void Scheduler::run_commands() {
  std::deque<std::function<void()>> todo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo.swap(commands_);
  }
  for (auto& f : todo) f();
}

Scheduler::Slot& Scheduler::slot_for_file(int id) {
  if (opt_.link) throw SlotError(SlotError::kOff, "slots are not saved or restored over ranks");
  if (!opt_.prefix_cache) {
    throw SlotError(SlotError::kOff,
                    "the prefix cache is off: slots keep ended requests' caches only with "
                    "--prefix-cache on");
  }
  if (id < 0 || id >= static_cast<int>(slots_.size())) {
    throw SlotError(SlotError::kNoSlot, strfmt("slot %d: the server has slots 0 to %d", id,
                                               static_cast<int>(slots_.size()) - 1));
  }
  Slot& s = slots_[id];
  if (s.active()) throw SlotError(SlotError::kBusy, strfmt("slot %d is processing a request", id));
  return s;
}

Scheduler::SlotResult Scheduler::save_slot(int id, const std::string& path) {
  SlotResult r;
  on_loop([&] {
    const Slot& s = slot_for_file(id);
    if (!s.kept()) throw SlotError(SlotError::kEmpty, strfmt("slot %d holds no cache", id));
    const double t0 = now_seconds();
    const std::vector<int> tokens(s.tokens.begin(), s.tokens.begin() + s.fed);
    r.bytes = save_cache(m_, *s.cache, tokens, path);
    r.tokens = s.fed;
    r.seconds = now_seconds() - t0;
  });
  return r;
}

Scheduler::SlotResult Scheduler::restore_slot(int id, const std::string& path) {
  SlotResult r;
  on_loop([&] {
    Slot& s = slot_for_file(id);
    const double t0 = now_seconds();
    const CacheFile f = open_cache_file(m_, shaped_, path);  // checked before any change
    const int n = f.n_tokens();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (s.kept()) {
        clear_slot(id);
        ++stats_.prefix_evictions;
      }
      // Other kept sequences give their blocks up, least recently used first.
      bool ok = s.cache->reserve(n);
      while (!ok && evict_one(id)) ok = s.cache->reserve(n);
      if (!ok) {
        throw SlotError(SlotError::kNoRoom,
                        strfmt("slot %d: the pool has no room for %d tokens (running requests "
                               "hold its blocks)",
                               id, n));
      }
    }
    try {
      s.tokens = restore_cache(*s.cache, f);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      clear_slot(id);
      throw;
    }
    s.cache->release_reservation();
    s.fed = n;
    s.prefill_end = 0;
    s.cache->publish(s.tokens.data());
    {
      std::lock_guard<std::mutex> lock(mu_);
      s.last_used = ++use_clock_;
    }
    r.tokens = n;
    r.bytes = f.file.bytes;
    r.seconds = now_seconds() - t0;
  });
  return r;
}

Scheduler::SlotResult Scheduler::erase_slot(int id) {
  SlotResult r;
  on_loop([&] {
    const Slot& s = slot_for_file(id);
    r.tokens = s.fed;
    std::lock_guard<std::mutex> lock(mu_);
    if (s.fed > 0) clear_slot(id);
  });
  return r;
}

}  // namespace kivi::runtime

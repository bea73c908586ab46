#include "core/threadpool.h"

#include <algorithm>
#include <chrono>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KIVI_PAUSE() _mm_pause()
#else
#define KIVI_PAUSE() ((void)0)
#endif

namespace kivi {

int hardware_threads() {
#if defined(__linux__)
  // The affinity mask, not the machine: under taskset or a cpuset the process may use
  // fewer cores than the machine has.
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadCount resolve_thread_count(int requested, bool force) {
  const int hw = hardware_threads();
  if (requested <= 0) return {hw, false};
  if (requested > hw && !force) return {hw, true};
  return {requested, false};
}

namespace {

// Spins with pause until pred() holds or kSpinMicros have passed; returns pred()'s last
// value. The clock is read every few pauses (a pause takes 10-150 ns depending on the
// CPU and on whether it runs under a hypervisor, so a pause count is no measure of time).
template <class Pred>
bool spin_until(Pred pred) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::microseconds(ThreadPool::kSpinMicros);
  do {
    for (int i = 0; i < 8; ++i) {
      if (pred()) return true;
      KIVI_PAUSE();
    }
  } while (Clock::now() < deadline);
  return pred();
}

}  // namespace

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(std::max(1, n_threads)), spin_(n_threads_ <= hardware_threads()) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_all();
  for (auto& t : workers_) t.join();
}

// A worker's share of a call: claims and runs tasks until none is left, then adds them
// to done_. A worker that finds tasks left after its first claim wakes one more blocked
// worker: the call is long (see run_caller_tasks), so helpers join one by one, each woken
// by the previous one.
uint32_t ThreadPool::run_tasks(int thread) {
  uint32_t ran = 0, n = 0;
  for (;;) {
    const uint64_t w = claim_.fetch_add(1, std::memory_order_acq_rel);
    const uint32_t task = static_cast<uint32_t>(w);
    n = static_cast<uint32_t>(w >> 32);
    if (task >= n) break;
    if (ran == 0 && task + 1 < n && sleepers_.load(std::memory_order_seq_cst) > 0) {
      epoch_.notify_one();
    }
    fn_(ctx_, static_cast<int>(task), thread);
    ++ran;
  }
  if (ran > 0) finish(ran, n);
  return ran;
}

// The caller's share of a call. Workers that are spinning join by themselves; a blocked
// one must be woken, which costs a futex call, and on a busy machine the woken thread
// can take the core from the caller itself, whose call then waits for the scheduler.
// That is worth it only for calls longer than kWakeAfterMicros. The caller wakes a worker
// before its first task when the last call from the same site says the remaining tasks
// will take that long (or the site is new), and otherwise as soon as the call has taken
// that long with tasks still unclaimed. The attention of a small model (a few tasks of
// a microsecond) thus runs on the caller and on spinning workers alone.
uint32_t ThreadPool::run_caller_tasks() {
  using Clock = std::chrono::steady_clock;
  constexpr int64_t kWakeAfterNs = int64_t{kWakeAfterMicros} * 1000;
  SiteTime& site = site_times_[(reinterpret_cast<uintptr_t>(fn_) >> 4) % kSites];
  bool may_wake = true;
  uint32_t ran = 0, n = 0;
  Clock::time_point start;
  for (;;) {
    const uint64_t w = claim_.fetch_add(1, std::memory_order_acq_rel);
    const uint32_t task = static_cast<uint32_t>(w);
    n = static_cast<uint32_t>(w >> 32);
    if (task >= n) break;
    if (ran == 0) {
      start = Clock::now();
    } else if (ran == 1) {
      site = {fn_,
              std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count()};
    }
    if (may_wake && task + 1 < n && sleepers_.load(std::memory_order_seq_cst) > 0) {
      const int64_t left = n - task - 1;
      const bool worth_it = ran == 0
                                ? site.site != fn_ || site.task_ns * left >= kWakeAfterNs
                                : Clock::now() - start >= std::chrono::nanoseconds(kWakeAfterNs);
      if (worth_it) {
        epoch_.notify_one();
        may_wake = false;
      }
    }
    fn_(ctx_, static_cast<int>(task), 0);
    ++ran;
  }
  if (ran == 1) {
    site = {fn_,
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count()};
  }
  if (ran > 0) finish(ran, n);
  return ran;
}

// Records n_done finished tasks; the thread that finishes the call's last task wakes the
// caller if it has blocked.
void ThreadPool::finish(uint32_t n_done, uint32_t n) {
  const uint32_t total = done_.fetch_add(n_done, std::memory_order_seq_cst) + n_done;
  if (total == n && caller_waiting_.load(std::memory_order_seq_cst) != 0) done_.notify_one();
}

void ThreadPool::dispatch(Trampoline fn, void* ctx, int n_tasks) {
  fn_ = fn;
  ctx_ = ctx;
  n_tasks_ = static_cast<uint32_t>(n_tasks);
  done_.store(0, std::memory_order_relaxed);
  // Publishing the claim word opens the call (release: fn_, ctx_, n_tasks_ and done_ are
  // visible to whoever claims a task); the epoch tells idle workers to look.
  claim_.store(uint64_t{n_tasks_} << 32, std::memory_order_release);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  run_caller_tasks();
  // Tasks that other threads claimed may still run: spin briefly (when the pool fits the
  // hardware), then block.
  const uint32_t n = n_tasks_;
  auto all_done = [&] { return done_.load(std::memory_order_acquire) == n; };
  if (all_done() || (spin_ && spin_until(all_done))) return;
  caller_waiting_.store(1, std::memory_order_seq_cst);
  uint32_t d;
  while ((d = done_.load(std::memory_order_seq_cst)) != n) done_.wait(d, std::memory_order_acquire);
  caller_waiting_.store(0, std::memory_order_relaxed);
}

// Waits until epoch_ differs from `seen` (a new call or the stop) and returns it: spins
// first when the pool fits the hardware, then blocks.
uint32_t ThreadPool::await_epoch(uint32_t seen) {
  uint32_t e = epoch_.load(std::memory_order_acquire);
  if (e != seen) return e;
  if (spin_ && spin_until([&] { return (e = epoch_.load(std::memory_order_acquire)) != seen; }))
    return e;
  // Announce the sleep before the last look at the epoch; dispatch bumps the epoch
  // before it looks for sleepers (both sequentially consistent), so one of the two
  // sees the other and no wake-up is lost.
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  while ((e = epoch_.load(std::memory_order_seq_cst)) == seen)
    epoch_.wait(seen, std::memory_order_acquire);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  return e;
}

void ThreadPool::worker_loop(int index) {
  // Epoch 0 is the pool before its first call; a worker that starts late sees the calls
  // it missed as one change and joins the current one.
  uint32_t seen = 0;
  for (;;) {
    seen = await_epoch(seen);
    if (stop_.load(std::memory_order_acquire)) return;
    run_tasks(index);
  }
}

}  // namespace kivi

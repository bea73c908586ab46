#include "core/threadpool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KIVI_PAUSE() _mm_pause()
#else
#define KIVI_PAUSE() ((void)0)
#endif

namespace kivi {

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_share(int index) {
  for (int t = index; t < n_tasks_; t += n_threads_) fn_(ctx_, t, index);
}

void ThreadPool::dispatch(Trampoline fn, void* ctx, int n_tasks) {
  fn_ = fn;
  ctx_ = ctx;
  n_tasks_ = n_tasks;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  run_share(0);
  // Wait for the workers; decode steps are short, so spin before yielding.
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < 20000) {
      KIVI_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    uint64_t g;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < 20000) {
        KIVI_PAUSE();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    run_share(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace kivi

// A fixed set of worker threads for data-parallel loops. Work is split statically
// (task i always runs on thread i % n), so results are deterministic for a given
// thread count. The caller's thread is worker 0. Dispatch is a function pointer plus
// a context pointer: no allocation on the per-token path.
#pragma once

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <cstdint>
#include <thread>
#include <vector>

namespace kivi {

class ThreadPool {
 public:
  // n_threads >= 1 counts the calling thread.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(task, thread) for every task in [0, n_tasks); thread i runs tasks
  // i, i + n, i + 2n, ... Returns when all tasks are done.
  template <class F>
  void run(int n_tasks, F&& fn) {
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || n_tasks == 1) {
      for (int t = 0; t < n_tasks; ++t) fn(t, 0);
      return;
    }
    auto trampoline = [](void* ctx, int task, int thread) {
      (*static_cast<std::remove_reference_t<F>*>(ctx))(task, thread);
    };
    dispatch(trampoline, static_cast<void*>(&fn), n_tasks);
  }

  // Splits [0, n) into size() contiguous ranges and runs fn(begin, end, thread).
  template <class F>
  void parallel_for(int64_t n, F&& fn) {
    const int nt = static_cast<int>(std::min<int64_t>(n_threads_, n));
    run(nt, [&](int task, int thread) {
      const int64_t b = n * task / nt, e = n * (task + 1) / nt;
      fn(b, e, thread);
    });
  }

 private:
  using Trampoline = void (*)(void*, int, int);
  void dispatch(Trampoline fn, void* ctx, int n_tasks);
  void worker_loop(int index);
  void run_share(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  Trampoline fn_ = nullptr;
  void* ctx_ = nullptr;
  int n_tasks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

// Number of hardware threads, at least 1.
int hardware_threads();

}  // namespace kivi

// A fixed set of worker threads for data-parallel loops. The caller's thread is worker 0.
//
// Tasks are handed out dynamically: every participating thread takes the next untaken task
// index from one shared counter until none is left, so a thread that the OS has not
// scheduled (another process holds its core) delays no one: the caller and the other
// workers take its share. Which thread runs a task therefore varies from call to call.
// Results stay deterministic when each task's output depends on its task index alone,
// never on the thread that runs it or on the order tasks run; the thread index is there to
// select per-thread scratch memory, which no two tasks use at the same time.
//
// Waiting is bounded: idle workers, and a caller waiting for tasks that other threads are
// still running, spin with pause for at most kSpinMicros, then block on a futex
// (std::atomic::wait), so the pool never holds a core it has no work for. Blocked workers
// are woken only for calls long enough to repay the wake-up. Dispatch is a
// function pointer plus a context pointer: no allocation on the per-token path.
//
// One thread at a time calls run() or parallel_for(); calls do not nest, and tasks do not
// throw.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
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

  // Runs fn(task, thread) once for every task in [0, n_tasks), with thread in
  // [0, size()), and returns when all tasks are done. Tasks go to whichever thread asks
  // first; the caller takes tasks too and never waits for a worker to wake up.
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

  // Splits [0, n) into contiguous ranges and runs fn(begin, end, thread) for each. With
  // more than one thread there are kRangesPerThread ranges per thread (at most n), so
  // threads that start late still find work; the boundaries depend on size(), so fn's
  // results must not depend on where a range begins.
  static constexpr int kRangesPerThread = 4;
  template <class F>
  void parallel_for(int64_t n, F&& fn) {
    if (n <= 0) return;
    const int64_t want = n_threads_ == 1 ? 1 : int64_t{n_threads_} * kRangesPerThread;
    const int nr = static_cast<int>(std::min<int64_t>(want, n));
    run(nr, [&](int task, int thread) {
      const int64_t b = n * task / nr, e = n * (task + 1) / nr;
      fn(b, e, thread);
    });
  }

  // How long an idle thread spins before it blocks. Between the parallel calls of one
  // decode step the caller works alone for a few microseconds; a worker that spins
  // through that gap starts the next call at once instead of after a futex wake-up.
  static constexpr int kSpinMicros = 50;
  // A blocked worker is woken only for a call that is expected to take, or has taken,
  // longer than this on the caller alone (see run_caller_tasks in threadpool.cpp).
  static constexpr int kWakeAfterMicros = 20;

 private:
  using Trampoline = void (*)(void*, int, int);
  void dispatch(Trampoline fn, void* ctx, int n_tasks);
  void worker_loop(int index);
  uint32_t await_epoch(uint32_t seen);
  uint32_t run_tasks(int thread);
  uint32_t run_caller_tasks();
  void finish(uint32_t n_done, uint32_t n_tasks);

  int n_threads_;
  bool spin_;  // false when the pool has more threads than the hardware: spinning would
               // take the cores from the threads that have work
  std::vector<std::thread> workers_;

  // The current call, written by the caller before it publishes claim_ and read by a
  // thread only after it has claimed a task of that call (which keeps the call open).
  Trampoline fn_ = nullptr;
  void* ctx_ = nullptr;
  uint32_t n_tasks_ = 0;

  // What the caller's first task took at each call site (a site is a trampoline: one per
  // lambda type), which tells the caller whether a call is worth waking a blocked worker
  // for. Read and written by the caller only.
  struct SiteTime {
    Trampoline site = nullptr;
    int64_t task_ns = 0;
  };
  static constexpr int kSites = 32;
  SiteTime site_times_[kSites];

  // Task claims: high 32 bits the call's task count, low 32 bits the next task index.
  // A claim is one fetch_add; an index at or past the count means no task is left. The
  // count travels in the same word so a thread waking late for a finished call reads
  // a count that matches the index it got.
  alignas(64) std::atomic<uint64_t> claim_{0};
  // Tasks of the current call that have finished.
  alignas(64) std::atomic<uint32_t> done_{0};
  std::atomic<uint32_t> caller_waiting_{0};
  // Bumped once per call (and at destruction); idle workers wait on it.
  alignas(64) std::atomic<uint32_t> epoch_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// Number of hardware threads this process may run on (its CPU affinity mask), at least 1.
int hardware_threads();

// The thread count for a requested --threads value: 0 means hardware_threads(); a request
// above the hardware count is capped to it (`capped` set) unless `force`.
struct ThreadCount {
  int threads;
  bool capped;
};
ThreadCount resolve_thread_count(int requested, bool force);

}  // namespace kivi

// The thread pool's contract: every task runs exactly once, a thread index is never in use
// by two tasks at once, results that depend only on the task index are the same bits with
// any thread count (also more threads than cores), a thread stuck in a task does not stop
// the others from finishing the call, blocked workers wake up (at once for a call site
// known to be long, and once a call from a site known to be quick has run long), and an
// idle pool shuts down.
// Also the --threads resolution (0 = all, capped above the hardware unless forced).
//
// ThreadSanitizer, by hand (the sanitize preset is ASan + UBSan), from the source root:
//   clang++ -std=c++20 -O1 -g -fsanitize=thread -Isrc tests/test_threadpool.cpp
//           src/core/threadpool.cpp -lgtest -lgtest_main -pthread -o /tmp/tsan_pool
//   /tmp/tsan_pool
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "core/threadpool.h"

namespace kivi {
namespace {

constexpr int kMaxThreads = 8;  // above the 2-4 cores of a typical CI machine: over-subscribed

// Waits (yielding) until pred() holds or 10 s pass; returns whether it held. Used where a
// broken pool would hang, so the test fails instead.
template <class Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(ThreadPool, EveryTaskRunsExactlyOnceOnAFreeThreadIndex) {
  for (int threads = 1; threads <= kMaxThreads; ++threads) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.size(), threads);
    for (int n : {0, 1, 2, 3, 7, 8, 9, 64, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::vector<std::atomic<int>> busy(threads);  // a thread index in use by a running task
      std::atomic<int> bad_thread{0}, shared_index{0};
      pool.run(n, [&](int task, int thread) {
        if (thread < 0 || thread >= threads) {
          bad_thread++;
          return;
        }
        if (busy[thread].exchange(1) != 0) shared_index++;
        hits[task]++;
        busy[thread].store(0);
      });
      EXPECT_EQ(bad_thread.load(), 0) << threads << " threads, " << n << " tasks";
      EXPECT_EQ(shared_index.load(), 0) << threads << " threads, " << n << " tasks";
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1)
            << "task " << i << " of " << n << ", " << threads << " threads";
    }
  }
}

// The pattern of the attention and matrix callers: each task writes its own slot, using
// per-thread scratch as working memory, and the caller reduces the slots in task order.
std::vector<float> task_indexed_sums(ThreadPool& pool, const std::vector<float>& x, int n_tasks) {
  const size_t per = x.size() / n_tasks;
  std::vector<float> slots(n_tasks);
  std::vector<std::vector<float>> scratch(pool.size(), std::vector<float>(per));
  pool.run(n_tasks, [&](int task, int thread) {
    float* s = scratch[thread].data();
    for (size_t i = 0; i < per; ++i) s[i] = std::sin(x[task * per + i]) * 1.0001f;
    float acc = 0.0f;  // float, in order: any change of order or of data changes the bits
    for (size_t i = 0; i < per; ++i) acc += s[i];
    slots[task] = acc;
  });
  float total = 0.0f;
  for (float v : slots) total += v;
  slots.push_back(total);
  return slots;
}

TEST(ThreadPool, ResultsAreTheSameBitsWithAnyThreadCount) {
  Rng rng(7);
  const int n_tasks = 96;
  std::vector<float> x(n_tasks * 257);
  for (auto& v : x) v = rng.uniform() * 8.0f - 4.0f;
  ThreadPool one(1);
  const std::vector<float> want = task_indexed_sums(one, x, n_tasks);
  for (int threads = 2; threads <= kMaxThreads; ++threads) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 20; ++rep) {
      const std::vector<float> got = task_indexed_sums(pool, x, n_tasks);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
          << threads << " threads, repetition " << rep;
    }
  }
}

TEST(ThreadPool, ParallelForCoversTheRangeInMoreRangesThanThreads) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 10, 12345}) {
      std::vector<int> seen(n, 0);
      std::atomic<int> ranges{0};
      pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
        ASSERT_LT(b, e);
        ranges++;
        for (int64_t i = b; i < e; ++i) seen[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << i;
      const int64_t want =
          threads == 1 ? 1 : std::min<int64_t>(n, threads * ThreadPool::kRangesPerThread);
      EXPECT_EQ(ranges.load(), want) << threads << " threads, n " << n;
    }
  }
}

// A thread held up inside a task (as by a process that takes its core) must not hold up
// the rest of the call: here task 0 waits for all the other tasks to finish, which only
// happens if the other threads take them all. With tasks bound to threads (task i on
// thread i % n) it would wait forever for its own thread's tasks. The other tasks take
// 100 us each, so the call is long enough to wake blocked workers for.
TEST(ThreadPool, AThreadStuckInATaskDoesNotStopTheOthers) {
  for (int threads : {2, 3, 8}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 30; ++rep) {
      const int n = 4 * threads;
      std::atomic<int> finished{0};
      std::atomic<bool> timed_out{false};
      pool.run(n, [&](int task, int) {
        if (task == 0) {
          if (!eventually([&] { return finished.load() == n - 1; })) timed_out = true;
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        finished++;
      });
      ASSERT_FALSE(timed_out.load()) << threads << " threads, repetition " << rep;
      ASSERT_EQ(finished.load(), n);
    }
  }
}

// After a pause longer than the spin, the workers are blocked on the futex. A call whose
// tasks all wait for each other (a barrier across size() tasks) completes only if every
// worker wakes up and joins. The first call is from a new site, the later ones from a site
// known to be long (each task works 200 us before the barrier), so the caller wakes a
// worker before its first task and each woken worker wakes the next.
TEST(ThreadPool, BlockedWorkersWakeUp) {
  for (int threads : {2, 3, 8}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 5; ++rep) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // >> kSpinMicros: all blocked
      std::atomic<int> arrived{0};
      std::atomic<int> timed_out{0};
      std::vector<std::atomic<int>> by_thread(threads);
      pool.run(threads, [&](int, int thread) {
        by_thread[thread]++;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        arrived++;
        if (!eventually([&] { return arrived.load() == threads; })) timed_out++;
      });
      ASSERT_EQ(timed_out.load(), 0) << threads << " threads, repetition " << rep;
      for (int t = 0; t < threads; ++t) EXPECT_EQ(by_thread[t].load(), 1) << "thread " << t;
    }
  }
}

// One call site (one lambda type) that runs either instantly or long: task 0 takes 1 ms
// and every later task the caller runs waits for a task on another thread. The caller wakes
// a blocked worker only for calls worth it; after instant calls from this site it must
// still do so once the call has run long. Returns false on a 10 s time-out.
bool call_site(ThreadPool& pool, bool slow) {
  std::atomic<int> on_workers{0}, timed_out{0};
  pool.run(3 * pool.size(), [&](int task, int thread) {
    if (!slow) return;
    if (thread != 0) {
      on_workers++;
    } else if (task == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else if (!eventually([&] { return on_workers.load() > 0; })) {
      timed_out++;
    }
  });
  return timed_out.load() == 0;
}

TEST(ThreadPool, ACallThatRunsLongWakesBlockedWorkers) {
  for (int threads : {2, 3, 8}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 3; ++rep) {
      for (int i = 0; i < 10; ++i) ASSERT_TRUE(call_site(pool, false));  // the site is quick
      std::this_thread::sleep_for(std::chrono::milliseconds(20));        // workers block
      ASSERT_TRUE(call_site(pool, true)) << threads << " threads, repetition " << rep;
    }
  }
}

TEST(ThreadPool, ManyCallsDoNotLoseWork) {
  for (int threads : {2, 3, 8}) {
    ThreadPool pool(threads);
    std::atomic<int64_t> sum{0};
    const int calls = threads > 3 ? 2000 : 20000;
    for (int r = 0; r < calls; ++r) pool.run(4, [&](int t, int) { sum += t; });
    EXPECT_EQ(sum.load(), int64_t{calls} * 6) << threads << " threads";
  }
}

// Calls separated by pauses around the spin time, so that wake-ups race with workers going
// to sleep.
TEST(ThreadPool, CallsAtTheSpinBoundaryDoNotLoseWork) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int r = 0; r < 300; ++r) {
    std::this_thread::sleep_for(
        std::chrono::microseconds(r % 3 == 0 ? 10 : ThreadPool::kSpinMicros + r % 40));
    pool.run(5, [&](int t, int) { sum += t; });
  }
  EXPECT_EQ(sum.load(), int64_t{300} * 10);
}

TEST(ThreadPool, DestroyedWhileIdle) {
  for (int rep = 0; rep < 20; ++rep) {
    { ThreadPool fresh(4); }  // workers may not have started yet
    {
      ThreadPool spinning(4);
      spinning.run(8, [](int, int) {});
    }  // workers are still spinning
    {
      ThreadPool blocked(4);
      blocked.run(8, [](int, int) {});
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }  // workers are blocked
  }
  SUCCEED();
}

TEST(ThreadCount, ZeroMeansAllAndMoreIsCappedUnlessForced) {
  const int hw = hardware_threads();
  ASSERT_GE(hw, 1);
  ASSERT_LE(static_cast<unsigned>(hw), std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(resolve_thread_count(0, false).threads, hw);
  EXPECT_FALSE(resolve_thread_count(0, false).capped);
  EXPECT_EQ(resolve_thread_count(1, false).threads, 1);
  EXPECT_FALSE(resolve_thread_count(1, false).capped);
  EXPECT_EQ(resolve_thread_count(hw, false).threads, hw);
  EXPECT_FALSE(resolve_thread_count(hw, false).capped);
  EXPECT_EQ(resolve_thread_count(hw + 1, false).threads, hw);
  EXPECT_TRUE(resolve_thread_count(hw + 1, false).capped);
  EXPECT_EQ(resolve_thread_count(1000, false).threads, hw);
  EXPECT_EQ(resolve_thread_count(hw + 1, true).threads, hw + 1);
  EXPECT_FALSE(resolve_thread_count(hw + 1, true).capped);
}

}  // namespace
}  // namespace kivi

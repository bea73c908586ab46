#include "core/bandwidth.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/bandwidth.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/aligned.h"
#include "core/threadpool.h"
#include "core/timer.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sums 32-bit words with four independent accumulators so loads, not adds, limit speed.
uint64_t ReadSum(const uint32_t* p, size_t n) {
  const hn::ScalableTag<uint32_t> d;
  const size_t N = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, hn::Load(d, p + i));
    a1 = hn::Add(a1, hn::Load(d, p + i + N));
    a2 = hn::Add(a2, hn::Load(d, p + i + 2 * N));
    a3 = hn::Add(a3, hn::Load(d, p + i + 3 * N));
  }
  // The lanes wrap (the sum only keeps the loads from being optimized away); they are
  // added in 64 bits here, as SumOfLanes may reduce through signed int on some targets.
  auto s = hn::Add(hn::Add(a0, a1), hn::Add(a2, a3));
  HWY_ALIGN uint32_t lanes[HWY_MAX_BYTES / sizeof(uint32_t)];
  hn::Store(s, d, lanes);
  uint64_t total = 0;
  for (size_t l = 0; l < N; ++l) total += lanes[l];
  for (; i < n; ++i) total += p[i];
  return total;
}

}  // namespace kivi::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kivi {
HWY_EXPORT(ReadSum);

struct BandwidthProbe::Impl {
  ThreadPool& pool;
  AlignedBuffer<uint32_t> buf;
  std::vector<uint64_t> sink;
};

BandwidthProbe::BandwidthProbe(ThreadPool& pool, size_t bytes)
    : impl_(new Impl{pool, AlignedBuffer<uint32_t>(bytes / sizeof(uint32_t), false),
                     std::vector<uint64_t>(pool.size())}) {
  const int64_t n = static_cast<int64_t>(impl_->buf.size());
  // Touch every page in parallel before the timed passes, so page faults stay out of
  // them. (The pool hands ranges to whichever thread is free, so the thread that reads a
  // page in a pass need not be the one that touched it.)
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) impl_->buf[i] = static_cast<uint32_t>(i);
  });
}

BandwidthProbe::~BandwidthProbe() { delete impl_; }

size_t BandwidthProbe::bytes() const { return impl_->buf.bytes(); }

double BandwidthProbe::pass() {
  const int64_t n = static_cast<int64_t>(impl_->buf.size());
  const double t0 = now_seconds();
  impl_->pool.parallel_for(n, [&](int64_t b, int64_t e, int thread) {
    // Round the split to 64-byte lines so every thread reads aligned vectors.
    const int64_t b16 = b / 16 * 16, e16 = (e == n) ? e : e / 16 * 16;
    impl_->sink[thread] +=
        HWY_DYNAMIC_DISPATCH(ReadSum)(impl_->buf.data() + b16, static_cast<size_t>(e16 - b16));
  });
  const double dt = now_seconds() - t0;
  return static_cast<double>(bytes()) / dt / 1e9;
}

BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  BandwidthProbe probe(pool, bytes);
  probe.pass();  // warm-up
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) gbps.push_back(probe.pass());
  BandwidthResult res;
  res.gbps_median = median(gbps);
  res.gbps_best = *std::max_element(gbps.begin(), gbps.end());
  res.bytes = probe.bytes();
  res.threads = pool.size();
  res.reps = reps;
  return res;
}

}  // namespace kivi
#endif  // HWY_ONCE

// Memory-read bandwidth probe. Decode attention over a long context cannot beat
// bytes read / this number, so benchmarks run it beside the kernels, at the same
// thread count.
#pragma once

#include <cstddef>

namespace kivi {
class ThreadPool;

struct BandwidthResult {
  double gbps_median;  // 1e9 bytes per second, median over repetitions
  double gbps_best;
  size_t bytes;  // bytes read per repetition
  int threads;
  int reps;
};

// A buffer of `bytes` (default 512 MiB, well past the last-level cache), read by every
// thread of the pool, one pass at a time, so benchmarks can interleave passes with the
// kernels they measure.
class BandwidthProbe {
 public:
  explicit BandwidthProbe(ThreadPool& pool, size_t bytes = size_t{512} << 20);
  ~BandwidthProbe();
  // One read of the whole buffer; returns 1e9 bytes per second.
  double pass();
  size_t bytes() const;

 private:
  struct Impl;
  Impl* impl_;
};

// `reps` passes (after one warm-up) of a fresh probe.
BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{512} << 20,
                                       int reps = 7);

}  // namespace kivi

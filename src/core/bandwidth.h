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
  size_t bytes;        // bytes read per repetition
  int threads;
  int reps;
};

// Reads a buffer of `bytes` (default 512 MiB, well past the last-level cache) with
// every thread of the pool, `reps` times.
BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{512} << 20,
                                       int reps = 7);

}  // namespace kivi

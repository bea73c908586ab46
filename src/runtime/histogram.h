// A latency histogram as Prometheus keeps one: counts of observations at or below each
// upper bound (cumulative when exported), their sum and their number.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kivi::runtime {

struct Histogram {
  std::vector<double> bounds;    // increasing upper bounds (seconds); +Inf is implied
  std::vector<uint64_t> counts;  // [bounds.size() + 1]: per bucket, not cumulative
  double sum = 0;
  uint64_t count = 0;

  Histogram() = default;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
};

}  // namespace kivi::runtime

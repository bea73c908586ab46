// Bulk normal samples, cheaply: 16 random bits index a table of the 65536 quantiles of
// the standard normal at (i + 0.5) / 65536, so one 64-bit draw of kivi::Rng gives four
// samples and a sample costs a table lookup (no log, sqrt or cos per value).
//
// The samples follow the normal distribution discretized to 65536 equally likely
// values: mean 0, standard deviation 0.9997, tails cut at +-4.33 (the 1/131072
// quantile). That is what random weights and random cache contents need; use
// Rng::normal for a continuous distribution.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/rng.h"

namespace kivi {

class NormalTable {
 public:
  // The table, built on first use (about a millisecond).
  static const NormalTable& get();

  // The quantile of N(0, 1) at (i + 0.5) / 65536.
  float quantile(uint16_t i) const { return q_[i]; }
  const float* data() const { return q_; }

  // out[0..n) = stddev * samples; consumes ceil(n / 4) draws of rng.
  void fill(Rng& rng, float* out, size_t n, float stddev = 1.0f) const;

 private:
  NormalTable();
  float q_[65536];
};

// Inverse of the standard normal CDF for p in (0, 1) (Acklam's rational approximation
// refined by one Halley step on erfc: error below 1e-15).
double normal_quantile(double p);

}  // namespace kivi

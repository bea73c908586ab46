#include "core/normal_table.h"

#include <cmath>

namespace kivi {

double normal_quantile(double p) {
  // P. J. Acklam, "An algorithm for computing the inverse normal cumulative
  // distribution function" (2003): relative error 1.15e-9, then one Halley step.
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double lo = 0.02425, hi = 1 - lo;
  double x;
  if (p < lo) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= hi) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

NormalTable::NormalTable() {
  // Symmetric by construction: q[65535 - i] = -q[i].
  for (int i = 0; i < 32768; ++i) {
    const float v = static_cast<float>(normal_quantile((i + 0.5) / 65536.0));
    q_[i] = v;
    q_[65535 - i] = -v;
  }
}

const NormalTable& NormalTable::get() {
  static const NormalTable t;
  return t;
}

void NormalTable::fill(Rng& rng, float* out, size_t n, float stddev) const {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const uint64_t r = rng.next_u64();
    out[i] = stddev * q_[r & 0xFFFF];
    out[i + 1] = stddev * q_[(r >> 16) & 0xFFFF];
    out[i + 2] = stddev * q_[(r >> 32) & 0xFFFF];
    out[i + 3] = stddev * q_[r >> 48];
  }
  if (i < n) {
    uint64_t r = rng.next_u64();
    for (; i < n; ++i, r >>= 16) out[i] = stddev * q_[r & 0xFFFF];
  }
}

}  // namespace kivi

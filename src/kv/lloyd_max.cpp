#include "kv/lloyd_max.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "core/normal_table.h"

namespace kivi::kv {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr int kMaxDim = 1 << 20;
constexpr int kNodes = 12;  // Gauss-Legendre points per panel

// Gauss-Legendre nodes and weights on [-1, 1]: roots of P_n by Newton's method from the
// Chebyshev-like guesses cos(pi (i + 0.75) / (n + 0.5)).
struct GaussLegendre {
  std::array<double, kNodes> x{}, w{};
  GaussLegendre() {
    for (int i = 0; i < kNodes; ++i) {
      double z = std::cos(kPi * (i + 0.75) / (kNodes + 0.5));
      double dp = 1.0;
      for (int iter = 0; iter < 100; ++iter) {
        double p0 = 1.0, p1 = z;  // P_{k-1}, P_k by the three-term recurrence
        for (int k = 2; k <= kNodes; ++k) {
          const double p2 = ((2 * k - 1) * z * p1 - (k - 1) * p0) / k;
          p0 = p1;
          p1 = p2;
        }
        dp = kNodes * (z * p1 - p0) / (z * z - 1.0);
        const double dz = p1 / dp;
        z -= dz;
        if (std::fabs(dz) < 1e-16) break;
      }
      x[i] = z;
      w[i] = 2.0 / ((1.0 - z * z) * dp * dp);
    }
  }
};

const GaussLegendre& gauss_legendre() {
  static const GaussLegendre gl;
  return gl;
}

// Integrals against f_d in the angle theta = asin(x), where the weight is cos(theta)^(d-2).
class SphereCoordinate {
 public:
  explicit SphereCoordinate(int dim) : power_(dim - 2.0) {
    panel_ = std::min(kPi / 32.0, 0.5 / std::sqrt(power_));
    theta_max_ = std::min(kPi / 2.0, std::sqrt(1400.0 / power_));
    inv_norm_ = 1.0;
    inv_norm_ = 1.0 / integrate<1>(-1.0, 1.0, [](double) { return std::array<double, 1>{1.0}; })[0];
  }

  // Sums of g(x) f_d(x) dx over x in [a, b], for N functions at once: g returns N values.
  template <int N, class G>
  std::array<double, N> integrate(double a, double b, G g) const {
    std::array<double, N> total{};
    const double lo = std::max(std::asin(std::clamp(a, -1.0, 1.0)), -theta_max_);
    const double hi = std::min(std::asin(std::clamp(b, -1.0, 1.0)), theta_max_);
    if (!(lo < hi)) return total;
    const GaussLegendre& gl = gauss_legendre();
    // Panels are the pieces of the fixed grid [j, j + 1) * panel_ inside [lo, hi], so every
    // cell sees the same rule.
    const int j_end = static_cast<int>(std::ceil(hi / panel_));
    for (int j = static_cast<int>(std::floor(lo / panel_)); j < j_end; ++j) {
      const double p = std::max(lo, j * panel_), q = std::min(hi, (j + 1) * panel_);
      if (!(p < q)) continue;
      const double half = 0.5 * (q - p), mid = 0.5 * (q + p);
      for (int i = 0; i < kNodes; ++i) {
        const double theta = mid + half * gl.x[i];
        // cos^(d-2) = (1 - x^2)^((d-2)/2) through log1p: log(cos(theta)) rounded near 1 would
        // carry an absolute error of ~1e-16, multiplied by d - 2 in the exponent.
        const double x = std::sin(theta);
        const double weight = gl.w[i] * half * std::exp(0.5 * power_ * std::log1p(-x * x));
        const std::array<double, N> v = g(x);
        for (int k = 0; k < N; ++k) total[k] += weight * v[k];
      }
    }
    for (double& t : total) t *= inv_norm_;
    return total;
  }

 private:
  double power_;      // d - 2
  double panel_;      // widest panel in theta
  double theta_max_;  // the weight is below e^-700 beyond it
  double inv_norm_;   // 1 / int cos^(d-2) over [-pi/2, pi/2]
};

void check_dim(int dim) {
  if (dim < 3 || dim > kMaxDim) fail("lloyd_max: dimension %d is outside [3, %d]", dim, kMaxDim);
}

// Centroids of the cells cut by `thresholds` (plus -1 and 1 at the ends).
void cell_means(const SphereCoordinate& sc, const std::vector<double>& thresholds,
                std::vector<double>& centroids) {
  const size_t k_cells = thresholds.size() + 1;
  for (size_t k = 0; k < k_cells; ++k) {
    const double a = k == 0 ? -1.0 : thresholds[k - 1];
    const double b = k + 1 == k_cells ? 1.0 : thresholds[k];
    const auto m = sc.integrate<2>(a, b, [](double x) { return std::array<double, 2>{1.0, x}; });
    // An empty cell (impossible from the initial thresholds) keeps its midpoint.
    centroids[k] = m[0] > 0 ? m[1] / m[0] : 0.5 * (a + b);
  }
}

}  // namespace

double sphere_coordinate_density(int dim, double x) {
  check_dim(dim);
  if (std::fabs(x) > 1.0) return 0.0;
  if (std::fabs(x) == 1.0) return dim == 3 ? 0.5 : 0.0;  // (1 - x^2)^0 = 1 at d = 3
  const double log_c = std::lgamma(0.5 * dim) - std::lgamma(0.5 * (dim - 1)) - 0.5 * std::log(kPi);
  return std::exp(log_c + 0.5 * (dim - 3) * std::log1p(-x * x));
}

CoordinateMoments sphere_coordinate_moments(int dim, double a, double b) {
  check_dim(dim);
  const SphereCoordinate sc(dim);
  const auto m = sc.integrate<3>(a, b, [](double x) {
    return std::array<double, 3>{1.0, x, x * x};
  });
  return {m[0], m[1], m[2]};
}

LloydMaxCodebook compute_lloyd_max(int dim, int bits) {
  check_dim(dim);
  if (bits < 1 || bits > 4) fail("lloyd_max: bits %d is outside [1, 4]", bits);
  const SphereCoordinate sc(dim);
  const int k_cells = 1 << bits;
  const double sigma = 1.0 / std::sqrt(static_cast<double>(dim));

  // Start from the quantiles of N(0, 1/d): strictly increasing and inside (-1, 1) for d >= 3
  // (the outermost, 1.53 / sqrt(3), is below 0.89).
  std::vector<double> thresholds(k_cells - 1), centroids(k_cells), next(k_cells);
  for (int k = 1; k < k_cells; ++k) {
    thresholds[k - 1] = normal_quantile(static_cast<double>(k) / k_cells) * sigma;
  }
  cell_means(sc, thresholds, centroids);

  LloydMaxCodebook cb;
  cb.dim = dim;
  cb.bits = bits;
  // Lloyd's iteration contracts by ~0.965 per step at b = 4, so a step of s leaves ~25 s to go:
  // it runs until the centroids move by less than 8 ulps of the largest (~1e-13 sigma left),
  // which is above the rounding noise of the integrals (1-3 ulps).
  constexpr int kMaxIterations = 100000;
  for (int iter = 1;; ++iter) {
    for (int k = 0; k + 1 < k_cells; ++k) thresholds[k] = 0.5 * (centroids[k] + centroids[k + 1]);
    cell_means(sc, thresholds, next);
    double moved = 0;
    for (int k = 0; k < k_cells; ++k) moved = std::max(moved, std::fabs(next[k] - centroids[k]));
    centroids.swap(next);
    const double largest = std::max(-centroids.front(), centroids.back());
    if (moved < 8 * std::numeric_limits<double>::epsilon() * largest) {
      cb.iterations = iter;
      break;
    }
    if (iter == kMaxIterations) {
      fail("lloyd_max: no convergence for d = %d, b = %d (last step %g)", dim, bits, moved);
    }
  }
  for (int k = 0; k + 1 < k_cells; ++k) thresholds[k] = 0.5 * (centroids[k] + centroids[k + 1]);

  // The distortion, integrated directly per cell (no cancellation against E[x^2] = 1/d).
  double mse = 0;
  for (int k = 0; k < k_cells; ++k) {
    const double a = k == 0 ? -1.0 : thresholds[k - 1];
    const double b = k + 1 == k_cells ? 1.0 : thresholds[k];
    const double c = centroids[k];
    mse += sc.integrate<1>(a, b,
                           [c](double x) { return std::array<double, 1>{(x - c) * (x - c)}; })[0];
  }
  cb.centroids = centroids;
  cb.thresholds = thresholds;
  cb.coord_mse = mse;
  cb.centroids_f.assign(centroids.begin(), centroids.end());
  cb.thresholds_f.assign(thresholds.begin(), thresholds.end());
  return cb;
}

const LloydMaxCodebook& lloyd_max_codebook(int dim, int bits) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, std::unique_ptr<LloydMaxCodebook>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[{dim, bits}];
  if (!slot) {
    // Computed under the lock: a second caller waits instead of computing the same table.
    slot = std::make_unique<LloydMaxCodebook>(compute_lloyd_max(dim, bits));
  }
  return *slot;
}

}  // namespace kivi::kv

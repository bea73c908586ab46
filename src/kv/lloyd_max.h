// Lloyd-Max scalar quantizers for one coordinate of a uniformly random unit vector: the
// per-coordinate codebooks of rotated vector quantization (TurboQuant, Zandieh et al.,
// arXiv 2504.19874, Sec. 3.1, Eq. 4). After a random rotation (kv/rotation.h) every
// coordinate x of a unit vector in R^d has the density
//
//   f_d(x) = c_d (1 - x^2)^((d - 3) / 2)  on [-1, 1],
//   c_d = Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2))
//
// (x = 2B - 1 with B ~ Beta((d-1)/2, (d-1)/2)): mean 0, variance exactly 1/d, and close to
// N(0, 1/d) for large d. A b-bit quantizer has K = 2^b centroids c_0 < ... < c_{K-1} and
// K - 1 thresholds t_k = (c_k + c_{k+1}) / 2; x is coded as the index of its cell. The
// Lloyd-Max conditions (each centroid the mean of f_d over its cell, each threshold the
// midpoint of its centroids) are solved by Lloyd's iteration in double. f_d is log-concave for
// d >= 3, so the fixed point is the unique optimum (Fleischer's condition) and it is symmetric.
//
// Integration. The substitution x = sin(theta) turns f_d(x) dx into
// c_d cos(theta)^(d - 2) dtheta on [-pi/2, pi/2], which is smooth (analytic) up to the ends,
// where the x-density has an algebraic singularity in its derivatives for small d. Composite
// Gauss-Legendre rules on panels of width at most 0.5 / sqrt(d - 2) in theta resolve the
// concentration at scale 1/sqrt(d) for large d; beyond |theta| = sqrt(1400 / (d - 2)) the
// weight is below e^-700 and is dropped. The normalization comes from the same rule, so the
// probabilities sum to 1 to rounding.
//
// Quality, for unit vectors (E||u - Q(u)||^2 = d * coord_mse), d = 128: 0.3609, 0.1160,
// 0.03397, 0.009315 for b = 1..4; the Gaussian limit (d -> inf) is 0.3634, 0.1175, 0.03455,
// 0.009501, and TurboQuant's Theorem 1 quotes 0.36, 0.117, 0.03, 0.009. Fractional bit widths
// (e.g. 2.5 bits: some channels at 2 bits, others at 3) combine these codebooks.
#pragma once

#include <vector>

namespace kivi::kv {

struct LloydMaxCodebook {
  int dim = 0;                      // d: the dimension of the unit vectors
  int bits = 0;                     // b: 2^b cells
  std::vector<double> centroids;    // [2^b] ascending, in units of a unit vector's coordinate
  std::vector<double> thresholds;   // [2^b - 1] thresholds[k] = (centroids[k] + centroids[k+1]) / 2
  double coord_mse = 0;             // E[(x - Q(x))^2] for x ~ f_d
  int iterations = 0;               // Lloyd iterations until the centroids moved < 8 ulps
  std::vector<float> centroids_f;   // [2^b] float copies, for quantizing
  std::vector<float> thresholds_f;  // [2^b - 1]

  // E||u - Q(u)||^2 over the d coordinates of a random unit vector u.
  double vector_mse() const { return dim * coord_mse; }
  // The code of x: the index of the nearest centroid, i.e. the number of thresholds below x
  // (a tie goes to the lower cell; both centroids are equally near).
  int code(float x) const {
    int c = 0;
    for (float t : thresholds_f) c += x > t;
    return c;
  }
  float centroid(int code) const { return centroids_f[code]; }
};

// f_d(x) above (0 outside [-1, 1]); dim >= 3. Closed form through lgamma, for tests.
double sphere_coordinate_density(int dim, double x);

// Integrals of f_d over [a, b] (clamped to [-1, 1]) by the quadrature above: the probability
// P = int f_d, the first moment M = int x f_d and the second S = int x^2 f_d.
struct CoordinateMoments {
  double mass = 0, first = 0, second = 0;
};
CoordinateMoments sphere_coordinate_moments(int dim, double a, double b);

// The b-bit Lloyd-Max codebook of f_d, computed now (milliseconds). dim in [3, 1 << 20],
// bits in [1, 4]; throws kivi::Error otherwise.
LloydMaxCodebook compute_lloyd_max(int dim, int bits);

// The same, computed once per (dim, bits) and cached for the life of the program;
// thread-safe, and the reference stays valid.
const LloydMaxCodebook& lloyd_max_codebook(int dim, int bits);

}  // namespace kivi::kv

// The seeded randomized Hadamard transform (kv/rotation.h) against its definition, and rotated
// vectors quantized with the Lloyd-Max codebooks (kv/lloyd_max.h): random unit vectors against
// the predicted distortion, vectors with an outlier coordinate against random ones. The
// codebooks themselves are tested in tests/test_lloyd_max.cpp (same executable).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kv/lloyd_max.h"
#include "kv/rotation.h"

namespace kivi {
namespace {

using kv::HadamardRotation;

std::vector<float> randn(int n, Rng& rng) {
  std::vector<float> v(n);
  for (float& x : v) x = rng.normal();
  return v;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

// The transform rebuilt from the header's definition alone: signs from the documented bit
// stream of kivi::Rng, Sylvester blocks largest first.
std::vector<double> definition_matrix(int d, uint64_t seed) {
  std::vector<int> blocks;
  for (int rest = d, n = 1 << 16; rest > 0; n /= 2) {
    if (n <= rest) blocks.push_back(n), rest -= n;
  }
  Rng rng(seed);
  std::vector<double> sign(d);
  for (int w = 0; w < (d + 63) / 64; ++w) {
    const uint64_t bits = rng.next_u64();
    for (int i = 64 * w; i < std::min(d, 64 * w + 64); ++i)
      sign[i] = (bits >> (i % 64)) & 1 ? -1 : 1;
  }
  std::vector<double> m(static_cast<size_t>(d) * d, 0.0);
  int o = 0;
  for (int n : blocks) {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        m[(o + i) * d + o + j] =
            (__builtin_popcount(i & j) % 2 ? -1 : 1) / std::sqrt(double(n)) * sign[o + j];
      }
    }
    o += n;
  }
  return m;
}

const int kDims[] = {1, 2, 3, 6, 8, 16, 64, 72, 80, 96, 112, 128, 192, 256};

TEST(Rotation, BlocksAreTheBinaryDecomposition) {
  EXPECT_EQ(kv::hadamard_blocks(128), (std::vector<int>{128}));
  EXPECT_EQ(kv::hadamard_blocks(96), (std::vector<int>{64, 32}));
  EXPECT_EQ(kv::hadamard_blocks(80), (std::vector<int>{64, 16}));
  EXPECT_EQ(kv::hadamard_blocks(192), (std::vector<int>{128, 64}));
  EXPECT_EQ(kv::hadamard_blocks(112), (std::vector<int>{64, 32, 16}));
  EXPECT_EQ(kv::hadamard_blocks(1), (std::vector<int>{1}));
  EXPECT_EQ(HadamardRotation(96, 1).blocks(), (std::vector<int>{64, 32}));
}

// The fast transform and its inverse equal the explicit matrix: |fast - R x|_inf <= 1e-6 |x|.
TEST(Rotation, FastPathEqualsTheDefinition) {
  Rng rng(11);
  for (int d : kDims) {
    for (uint64_t seed : {0ull, 7ull, 0xDEADBEEFull}) {
      SCOPED_TRACE(testing::Message() << "d=" << d << " seed=" << seed);
      const HadamardRotation rot(d, seed);
      const std::vector<double> m = definition_matrix(d, seed);
      ASSERT_EQ(rot.matrix(), m);
      for (int trial = 0; trial < 4; ++trial) {
        const std::vector<float> x = randn(d, rng);
        std::vector<float> y = x, z = x;
        rot.forward(y.data());
        rot.inverse(z.data());
        const double bound = 1e-6 * norm(x);
        for (int i = 0; i < d; ++i) {
          double rx = 0, rtx = 0;
          for (int j = 0; j < d; ++j) {
            rx += m[i * d + j] * x[j];
            rtx += m[j * d + i] * x[j];
          }
          ASSERT_NEAR(y[i], rx, bound) << "forward, coordinate " << i;
          ASSERT_NEAR(z[i], rtx, bound) << "inverse, coordinate " << i;
        }
      }
    }
  }
}

// R R^T = I in double (block-diagonal Hadamard blocks are orthonormal too), and the entries
// are +-1/sqrt(n) inside the blocks and 0 outside.
TEST(Rotation, MatrixIsOrthonormalAndBlockDiagonal) {
  for (int d : kDims) {
    const std::vector<double> m = HadamardRotation(d, 5).matrix();
    for (int i = 0; i < d; ++i) {
      for (int k = 0; k < d; ++k) {
        double dot = 0;
        for (int j = 0; j < d; ++j) dot += m[i * d + j] * m[k * d + j];
        ASSERT_NEAR(dot, i == k ? 1.0 : 0.0, 1e-12) << "d=" << d << " rows " << i << ", " << k;
      }
    }
    int o = 0;
    for (int n : kv::hadamard_blocks(d)) {
      for (int i = 0; i < d; ++i) {
        for (int j = o; j < o + n; ++j) {
          const bool inside = i >= o && i < o + n;
          ASSERT_NEAR(std::fabs(m[i * d + j]), inside ? 1 / std::sqrt(double(n)) : 0.0, 1e-15);
        }
      }
      o += n;
    }
  }
}

// Norms and dot products are preserved, and inverse(forward(x)) == x, to 1e-6 relative,
// whatever the scale of x.
TEST(Rotation, PreservesNormsAndInverts) {
  Rng rng(3);
  for (int d : kDims) {
    const HadamardRotation rot(d, 42);
    for (float scale : {1e-3f, 1.0f, 1e4f}) {
      std::vector<float> x = randn(d, rng), q = randn(d, rng);
      for (float& v : x) v *= scale;
      std::vector<float> y = x, rq = q;
      rot.forward(y.data());
      rot.forward(rq.data());
      EXPECT_NEAR(norm(y), norm(x), 1e-6 * norm(x));
      double dot_x = 0, dot_y = 0;
      for (int i = 0; i < d; ++i) dot_x += double(x[i]) * q[i], dot_y += double(y[i]) * rq[i];
      EXPECT_NEAR(dot_y, dot_x, 1e-6 * norm(x) * norm(q));
      rot.inverse(y.data());
      for (int i = 0; i < d; ++i) ASSERT_NEAR(y[i], x[i], 1e-6 * norm(x)) << "d=" << d;
    }
  }
}

TEST(Rotation, SeedsGiveDifferentTransforms) {
  for (int d : {64, 96, 128}) {
    const HadamardRotation a(d, 1), b(d, 2);
    int differing = 0;
    for (int i = 0; i < d; ++i) differing += a.sign(i) != b.sign(i);
    EXPECT_GT(differing, d / 4);
    EXPECT_LT(differing, 3 * d / 4);
    Rng rng(9);
    std::vector<float> x = randn(d, rng), y = x;
    a.forward(x.data());
    b.forward(y.data());
    double diff = 0;
    for (int i = 0; i < d; ++i) diff += double(x[i] - y[i]) * (x[i] - y[i]);
    EXPECT_GT(std::sqrt(diff), 0.5 * norm(x));  // random rotations: ~sqrt(2) |x| apart
  }
  // One seed per (layer, KV head), all distinct, and the documented formula.
  const auto mix = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::vector<uint64_t> seeds;
  for (int layer = 0; layer < 80; ++layer) {
    for (int head = 0; head < 16; ++head) {
      const uint64_t s = kv::rotation_seed(1234, layer, head);
      EXPECT_EQ(s, mix(1234 ^ mix((uint64_t(layer) << 32) | uint64_t(head))));
      seeds.push_back(s);
    }
  }
  std::sort(seeds.begin(), seeds.end());
  EXPECT_EQ(std::unique(seeds.begin(), seeds.end()), seeds.end());
  EXPECT_NE(kv::rotation_seed(1, 0, 0), kv::rotation_seed(2, 0, 0));
}

TEST(Rotation, RejectsBadShapes) {
  EXPECT_THROW(HadamardRotation(0, 1), Error);
  EXPECT_THROW(HadamardRotation(65537, 1), Error);
}

// E|u - Q(u)|^2 over the rows of x [n, d] normalized to unit vectors u, each rotated by `rot`
// (none: quantized as they are) and coded per coordinate with the d-dimensional codebook.
// R is orthonormal, so this is also the error of R^T Q(R u) against u.
double quantized_mse(const std::vector<float>& x, int d, const HadamardRotation* rot,
                     const kv::LloydMaxCodebook& cb) {
  const size_t n = x.size() / d;
  double total = 0;
  std::vector<float> u(d);
  for (size_t v = 0; v < n; ++v) {
    u.assign(x.begin() + v * d, x.begin() + (v + 1) * d);
    const float inv = static_cast<float>(1 / norm(u));
    for (float& c : u) c *= inv;
    if (rot) rot->forward(u.data());
    for (float c : u) total += std::pow(double(c) - cb.centroid(cb.code(c)), 2);
  }
  return total / n;
}

// n rows of N(0, 1) noise in R^d, row v with `outlier` added to coordinate v % d.
std::vector<float> gaussian_rows(int n, int d, float outlier, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (float& c : x) c = rng.normal();
  for (int v = 0; v < n; ++v) x[static_cast<size_t>(v) * d + v % d] += outlier;
  return x;
}

// 20000 random unit vectors, rotated and quantized coordinate by coordinate, have the squared
// error the codebook predicts (within 3%; the sampling error is ~0.2%), and so does their
// reconstruction R^T Q(R u) in the original coordinates.
TEST(RotatedQuantization, RandomUnitVectorsMatchTheTable) {
  for (int d : {128, 96}) {
    const std::vector<float> x = gaussian_rows(20000, d, 0, 2024);
    const HadamardRotation rot(d, kv::rotation_seed(77, 3, 1));
    for (int b = 1; b <= 4; ++b) {
      const kv::LloydMaxCodebook& cb = kv::lloyd_max_codebook(d, b);
      const double measured = quantized_mse(x, d, &rot, cb);
      std::printf("d=%d b=%d: per coordinate %.4e measured, %.4e predicted (ratio %.4f)\n", d, b,
                  measured / d, cb.coord_mse, measured / cb.vector_mse());
      EXPECT_NEAR(measured / cb.vector_mse(), 1.0, 0.03) << "d=" << d << " b=" << b;
    }
    // One vector through the whole round trip: quantize in the rotated basis, rotate back.
    const kv::LloydMaxCodebook& cb = kv::lloyd_max_codebook(d, 2);
    std::vector<float> u(x.begin(), x.begin() + d), y;
    const double inv = 1 / norm(u);
    for (float& c : u) c = static_cast<float>(c * inv);
    y = u;
    rot.forward(y.data());
    double rotated_err = 0, err = 0;
    for (float& c : y) {
      const float q = cb.centroid(cb.code(c));
      rotated_err += std::pow(double(c) - q, 2);
      c = q;
    }
    rot.inverse(y.data());
    for (int i = 0; i < d; ++i) err += std::pow(double(u[i]) - y[i], 2);
    EXPECT_NEAR(err, rotated_err, 1e-5 * rotated_err);
  }
}

// A vector with one huge coordinate (30x the others' scale: ~88% of the energy at d = 128)
// quantizes badly as it is, and at least as well as a random vector once rotated. A nearly
// one-hot vector (1000x) becomes flat, +-1/sqrt(d) in every coordinate: its error is set by
// where 1/sqrt(d) falls among the centroids, worse than a random vector's at 2 and 3 bits.
TEST(RotatedQuantization, OutliersQuantizeLikeRandomVectors) {
  const int d = 128, n = 4000;
  const std::vector<float> big = gaussian_rows(n, d, 30, 99), huge = gaussian_rows(n, d, 1000, 98);
  for (uint64_t seed : {1ull, 2ull, 3ull}) {
    const HadamardRotation rot(d, seed);
    for (int b = 1; b <= 4; ++b) {
      const kv::LloydMaxCodebook& cb = kv::lloyd_max_codebook(d, b);
      const double table = cb.vector_mse();
      const double plain = quantized_mse(big, d, nullptr, cb) / table;
      const double rotated = quantized_mse(big, d, &rot, cb) / table;
      const double one_hot = quantized_mse(huge, d, &rot, cb) / table;
      std::printf(
          "seed %d b=%d, error / random vector's: 30x outlier %.2f unrotated, %.3f rotated; "
          "1000x rotated %.3f\n",
          int(seed), b, plain, rotated, one_hot);
      EXPECT_GT(plain, 2.5);
      EXPECT_LT(rotated, 1.0);
      if (b == 2 || b == 3) {
        EXPECT_GT(one_hot, 1.5);
      } else {
        EXPECT_LT(one_hot, 0.5);
      }
    }
  }
}

// Non-power-of-two head_dim: each block mixes only inside itself, so an outlier spreads over
// its block alone; with a 30x outlier in every position the error stays near a random
// vector's.
TEST(RotatedQuantization, OutliersWithBlockDiagonalHeadDims) {
  for (int d : {96, 80, 192}) {
    const std::vector<float> big = gaussian_rows(4000, d, 30, 7);
    const HadamardRotation rot(d, 5);
    for (int b = 1; b <= 4; ++b) {
      const kv::LloydMaxCodebook& cb = kv::lloyd_max_codebook(d, b);
      const double rotated = quantized_mse(big, d, &rot, cb) / cb.vector_mse();
      const double plain = quantized_mse(big, d, nullptr, cb) / cb.vector_mse();
      std::printf("d=%d b=%d, 30x outlier, error / random vector's: %.2f unrotated, %.3f rotated\n",
                  d, b, plain, rotated);
      EXPECT_LT(rotated, 1.1);
      EXPECT_GT(plain, 2.5);
    }
  }
}

}  // namespace
}  // namespace kivi

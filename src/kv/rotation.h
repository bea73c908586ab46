// A seeded randomized Hadamard transform: a fixed orthonormal rotation of head_dim-vectors
// that spreads every coordinate's energy over many coordinates, so that after it each
// coordinate of a unit vector follows (nearly) the distribution of one coordinate of a
// uniformly random unit vector. Rotated vector quantizers (TurboQuant, Zandieh et al.,
// arXiv 2504.19874, Sec. 3.1) rely on this to use one fixed scalar codebook per coordinate
// (kv/lloyd_max.h).
//
// Definition. For d = head_dim, the blocks are the binary decomposition of d, largest first:
// d = n_1 + n_2 + ... with distinct powers of two n_1 > n_2 > ... (128 = 128, 96 = 64 + 32,
// 80 = 64 + 16, 192 = 128 + 64, 112 = 64 + 32 + 16). The transform is
//
//   R = blockdiag(H_{n_1} D_1, H_{n_2} D_2, ...),   H_n[i][j] = (-1)^popcount(i & j) / sqrt(n)
//
// (Sylvester's Hadamard matrix, symmetric and orthonormal) with D_k the diagonal of that
// block's random signs: forward(x) = R x (signs, then the fast Walsh-Hadamard transform),
// inverse(y) = R^T y = blockdiag(D_k H_{n_k}) y. R is orthonormal: norms and dot products are
// preserved (q . k = Rq . Rk), and inverse(forward(x)) = x up to float rounding.
//
// Signs. Generator kivi::Rng(seed) draws ceil(d / 64) 64-bit words; the sign of coordinate i
// is bit (i % 64) of word i / 64, where bit 1 means -1. Coordinates are numbered in the
// vector, not within blocks, so each block has its own independent signs. rotation_seed()
// derives the seed of each (layer, KV head) from one base seed, so a KV file records one
// number.
//
// Non-power-of-two head_dim: block-diagonal rather than padding. Padding d = 96 to 128 would
// store 128 rotated coordinates per vector (+33% code bytes), since the padded transform
// maps R^96 into R^128 and all 128 outputs are needed to invert it. Blocks keep d outputs and
// exact orthonormality at no storage cost; the price is that the transform mixes only within
// a block: a coordinate's energy spreads over its block (32 of 96 coordinates at worst), so a
// vector whose energy sits in one block has rotated coordinates of unequal scale across
// blocks and fits the d-dimensional codebook less well. Random (isotropic) vectors are
// unaffected: every orthonormal transform maps them to the same distribution. With an
// outlier of 30x the other coordinates (d = 96, 80, 192) the quantization error stays within
// 0.8-1.03x that of a random vector (tests/test_rotation.cpp).
//
// Limits. R is not a uniformly random rotation: it maps a basis vector e_j to a flat vector
// (every coordinate of its block +-1/sqrt(n)), not to a random direction. A vector dominated
// by one coordinate therefore quantizes with an error set by where 1/sqrt(n) falls among the
// centroids: with outliers up to ~30x the typical coordinate (~90% of the energy at d = 128)
// the error is at most that of a random vector, but a nearly one-hot vector (1000x) has
// 2.2x (2 bits) and 1.8x (3 bits) a random vector's error, and 0.1x and 0.4x at 1 and 4 bits.

#pragma once

#include <cstdint>
#include <vector>

namespace kivi::kv {

// The power-of-two block sizes of a head_dim, largest first (96 -> {64, 32}).
std::vector<int> hadamard_blocks(int dim);

// The seed of the rotation of one (layer, KV head), from the one base seed a KV file records:
//   rotation_seed = splitmix64(base_seed ^ splitmix64((layer << 32) | kv_head))
// with splitmix64(z) = finalizer of z + 0x9E3779B97F4A7C15 (Steele et al.'s constants, as in
// kivi::Rng). Keys and values of a head may share the rotation (they are quantized apart).
uint64_t rotation_seed(uint64_t base_seed, int layer, int kv_head);

class HadamardRotation {
 public:
  // dim in [1, 65536]; throws kivi::Error otherwise.
  HadamardRotation(int dim, uint64_t seed);

  int dim() const { return dim_; }
  uint64_t seed() const { return seed_; }
  const std::vector<int>& blocks() const { return blocks_; }
  // The sign (+1 or -1) of coordinate i, as defined above.
  float sign(int i) const { return scaled_signs_[i] < 0 ? -1.0f : 1.0f; }

  // x[0..dim) <- R x, in place; O(dim log dim) scalar butterflies in float (~0.2 us at d = 128).
  void forward(float* x) const;
  // x[0..dim) <- R^T x, in place: the inverse of forward.
  void inverse(float* x) const;

  // The explicit matrix R, built from the definition in double: [dim, dim] row-major, so
  // forward(x)[i] = sum_j R[i * dim + j] x[j]. The reference for tests.
  std::vector<double> matrix() const;

 private:
  int dim_;
  uint64_t seed_;
  std::vector<int> blocks_;
  std::vector<float> scaled_signs_;  // [dim]: sign / sqrt(size of the coordinate's block)
};

}  // namespace kivi::kv

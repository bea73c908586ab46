#include "kv/rotation.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace kivi::kv {
namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// a[0..n) <- H a with H[i][j] = (-1)^popcount(i & j), n a power of two: one radix-2 stage of
// n/2 butterflies (u, v) -> (u + v, u - v) with stride h.
void radix2_stage(float* a, int n, int h) {
  for (int i = 0; i < n; i += 2 * h) {
    for (int j = i; j < i + h; ++j) {
      const float u = a[j], v = a[j + h];
      a[j] = u + v;
      a[j + h] = u - v;
    }
  }
}

// Unnormalized fast Walsh-Hadamard transform of a[0..n), n a power of two, in Sylvester's
// (natural) order. The stages h = 1, 2, 4 run in registers on groups of 8; the rest two at a
// time (h and 2h: one pass over memory for two stages). Each output is the same sum in the same
// order as stage-by-stage radix 2, so the result is bit-identical to it.
void fwht(float* a, int n) {
  int h = 1;
  if (n >= 8) {
    for (int i = 0; i < n; i += 8) {
      float* x = a + i;
      const float s0 = x[0] + x[1], d0 = x[0] - x[1], s1 = x[2] + x[3], d1 = x[2] - x[3];
      const float s2 = x[4] + x[5], d2 = x[4] - x[5], s3 = x[6] + x[7], d3 = x[6] - x[7];
      const float t0 = s0 + s1, t1 = d0 + d1, t2 = s0 - s1, t3 = d0 - d1;
      const float t4 = s2 + s3, t5 = d2 + d3, t6 = s2 - s3, t7 = d2 - d3;
      x[0] = t0 + t4, x[1] = t1 + t5, x[2] = t2 + t6, x[3] = t3 + t7;
      x[4] = t0 - t4, x[5] = t1 - t5, x[6] = t2 - t6, x[7] = t3 - t7;
    }
    for (h = 8; 4 * h <= n; h *= 4) {
      for (int i = 0; i < n; i += 4 * h) {
        float* p = a + i;
        for (int j = 0; j < h; ++j) {
          const float w = p[j], x = p[j + h], y = p[j + 2 * h], z = p[j + 3 * h];
          const float s = w + x, d = w - x, t = y + z, e = y - z;
          p[j] = s + t, p[j + h] = d + e, p[j + 2 * h] = s - t, p[j + 3 * h] = d - e;
        }
      }
    }
  }
  for (; h < n; h *= 2) radix2_stage(a, n, h);
}

}  // namespace

std::vector<int> hadamard_blocks(int dim) {
  std::vector<int> blocks;
  for (int bit = 30; bit >= 0; --bit) {
    if (dim & (1 << bit)) blocks.push_back(1 << bit);
  }
  return blocks;
}

uint64_t rotation_seed(uint64_t base_seed, int layer, int kv_head) {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(layer)) << 32) | static_cast<uint32_t>(kv_head);
  return splitmix64(base_seed ^ splitmix64(key));
}

HadamardRotation::HadamardRotation(int dim, uint64_t seed) : dim_(dim), seed_(seed) {
  if (dim < 1 || dim > 65536) fail("rotation: head_dim %d is outside [1, 65536]", dim);
  blocks_ = hadamard_blocks(dim);
  scaled_signs_.resize(dim);
  Rng rng(seed);
  for (int w = 0; w < (dim + 63) / 64; ++w) {
    const uint64_t bits = rng.next_u64();
    for (int i = w * 64; i < std::min(dim, w * 64 + 64); ++i) {
      scaled_signs_[i] = ((bits >> (i % 64)) & 1) ? -1.0f : 1.0f;
    }
  }
  int offset = 0;
  for (int n : blocks_) {
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
    for (int i = offset; i < offset + n; ++i) scaled_signs_[i] *= scale;
    offset += n;
  }
}

void HadamardRotation::forward(float* x) const {
  for (int i = 0; i < dim_; ++i) x[i] *= scaled_signs_[i];
  int offset = 0;
  for (int n : blocks_) {
    fwht(x + offset, n);
    offset += n;
  }
}

void HadamardRotation::inverse(float* x) const {
  int offset = 0;
  for (int n : blocks_) {
    fwht(x + offset, n);
    offset += n;
  }
  for (int i = 0; i < dim_; ++i) x[i] *= scaled_signs_[i];
}

std::vector<double> HadamardRotation::matrix() const {
  // R[i][j] = H_n[i - o][j - o] / sqrt(n) * sign(j) for i, j in the block [o, o + n).
  const size_t d = static_cast<size_t>(dim_);
  std::vector<double> m(d * d, 0.0);  // [dim, dim]
  int offset = 0;
  for (int n : blocks_) {
    const double inv_sqrt_n = 1.0 / std::sqrt(static_cast<double>(n));
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        const double h = (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * inv_sqrt_n;
        m[(offset + i) * d + offset + j] = h * sign(offset + j);
      }
    }
    offset += n;
  }
  return m;
}

}  // namespace kivi::kv

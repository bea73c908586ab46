// Rotated vector quantization of KV rows: the tq formats (TurboQuant's first stage, Zandieh
// et al., arXiv 2504.19874, Sec. 3.1). A key or value row x of one head (d = head_dim) is
//
//   1. rotated: y = R x, R the head's seeded randomized Hadamard transform (kv/rotation.h),
//      after which every coordinate of y / |y| follows (nearly) the density of one
//      coordinate of a uniform unit vector in R^d;
//   2. coded: c_i = the index of the centroid of the b_i-bit Lloyd-Max codebook of that
//      density (kv/lloyd_max.h) nearest to y_i / |y|, where b_i = b for tq2, tq3 and tq4,
//      and for the split widths tq2.5 / tq3.5 b_i = b + 1 on the first floor(d / 4) rotated
//      coordinates and b on the rest (32 of 128 coordinates get the extra bit, the paper's
//      2.5-bit setting: 2.25 and 3.25 bits of codes per element; kv::bits_per_element
//      counts the scale too, 0.125 more at d = 128 with f16 scales);
//   3. scaled: one number per row, s = |x|^2 / <y, u> with u_i = centroid(c_i), stored in the
//      cache's parameter type (f16 by default; 0 for x = 0).
//
// The row reads back as x' = s R^T u. The scale is not |x| (the paper's) but the one that
// makes <x', x> = |x|^2: a Lloyd-Max reconstruction is shorter than its vector on average
// (E<y, u> = |u|^2 = 1 - mse for a unit vector), so with |x| every attention score would
// shrink by about 1 - mse (0.88 at 2 bits), a change of softmax temperature; this scale
// removes the shrinkage (the inner product with a correlated query is unbiased; tests/test_tq.cpp
// measures it) and changes the mean squared error little: on random unit vectors at d = 64,
// 0.127 instead of 0.114 at 2 bits, within 3% of the norm's at 3 and 4 bits.
//
// Codes are a little-endian bit stream per row: code i occupies bits [o_i, o_i + b_i) with
// o_i = sum of b_j over j < i, bit k of the row being bit k % 8 of byte k / 8 (the row is
// padded with zero bits to whole bytes). Attention reads the codes in the rotated space:
// scores against the rotated query, values summed as rotated rows and the sum rotated back
// once per head (attn/task.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/format.h"
#include "kv/rotation.h"

namespace kivi::kv {

class TqCodec {
 public:
  // A tq format for rows of `dim` (>= 4) coordinates; throws kivi::Error otherwise.
  TqCodec(Format f, int dim);

  Format format() const { return format_; }
  int dim() const { return dim_; }
  int wide() const { return wide_; }  // coordinates [0, wide) have bits() + 1 bits
  int bits() const { return bits_; }
  int bits(int i) const { return i < wide_ ? bits_ + 1 : bits_; }
  size_t row_bytes() const { return row_bytes_; }
  // The centroids of coordinate i's codebook ([2^bits(i)], ascending).
  const float* centroids(int i) const { return i < wide_ ? wide_c_.data() : narrow_c_.data(); }

  // Codes x[dim] into codes[row_bytes()] (every byte written) and returns the scale s.
  // tmp: dim floats of scratch.
  float encode(const float* x, const HadamardRotation& rot, uint8_t* codes, float* tmp) const;
  // The rotated reconstruction: out[i] = scale * centroid(code i).
  void decode_rotated(const uint8_t* codes, float scale, float* out) const;
  // The reconstruction in the original space: R^T of decode_rotated.
  void decode(const uint8_t* codes, float scale, const HadamardRotation& rot, float* out) const;

  // Code i of a row.
  int code(const uint8_t* codes, int i) const;

  // A 31-bit fingerprint of the codebooks (their float centroids and the split): a KV file
  // records it, so that a build whose codebooks differ refuses the file.
  uint32_t fingerprint() const;

 private:
  Format format_;
  int dim_, bits_, wide_;
  size_t row_bytes_;
  std::vector<float> narrow_c_, narrow_t_, wide_c_, wide_t_;  // centroids, thresholds
};

// The codec of a stream's format, shared and built once per (format, dim); null for
// formats other than tq.
const TqCodec* tq_codec(Format f, int dim);

}  // namespace kivi::kv

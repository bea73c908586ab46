// The inner loop of block selection: dot products of f16 summary rows with one float
// vector. Every kind's score is one of these (options.h): with P = sum_r max(q_r, 0)
// and N = sum_r min(q_r, 0) over the query heads r of a KV head, Quest's summed bound
// sum_r sum_c max(q_rc min_c, q_rc max_c) is [N, P] . [min, max] (a channel's product
// with the larger of min and max is q max where q > 0, q min where q < 0), and max
// and mean score (sum_r q_r) . max and (sum_r q_r) . mean.
#pragma once

#include <cstddef>

#include "core/f16.h"

namespace kivi::sparse {

// out[i] = sum_j w[j] x[i * stride + j] for i < n, j < len (x f16), on the SIMD target
// chosen at run time.
void dot_f16_rows(const f16_t* x, size_t stride, size_t n, const float* w, size_t len, float* out);
// The same in double, scalar (the reference tests compare against).
void dot_f16_rows_ref(const f16_t* x, size_t stride, size_t n, const float* w, size_t len,
                      float* out);

}  // namespace kivi::sparse

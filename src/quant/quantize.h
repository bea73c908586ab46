// Quantization of f32 rows into the GGUF block types, written from the format
// definitions (quant/blocks.h).
//
// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 follow the formats' reference rounding, so their
// bytes equal ggml's (ggml_quantize_chunk without an importance matrix):
//   Q8_0  d = amax / 127, q = round(x / d) (halves away from zero)
//   Q4_0  d = m / -8 with m the value of largest magnitude, q = min(15, trunc(x / d + 8.5))
//   Q5_0  d = m / -16, q = min(31, trunc(x / d + 16.5))
//   Q4_1  d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5))
//   Q5_1  d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5)
// (x / d is computed as x * (1 / d) in f32, and d and m are stored as f16.)
//
// MXFP4 follows its reference too (bytes equal to ggml's): the shared exponent is
// e = floor(log2(amax)) + 125 (mxfp4_exponent), and each value takes the code whose
// value kMxfp4Values[q] * 2^(e - 128) is nearest, the lowest code on ties.
//
// The K-quants (quantize_k.cpp) search each sub-block's scale (and min) for the least
// squared error, quantize the scales to the super-block's 4, 6 or 8 bits, then try the
// neighbouring scale codes and keep the best; their RMS error is compared with ggml's
// in the tests. Q8_K (the activation format) follows ggml's rounding exactly.
#pragma once

#include <cstdint>

#include "quant/types.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::quant {

// Writes row_bytes(t, n) bytes of `t` holding src[n]; n is a multiple of the block
// size. F32/F16/BF16 convert (round to nearest even).
void quantize_row(Type t, const float* src, void* dst, int64_t n);

// quantize_row over n values in block-aligned pieces on `pool` (nullptr: this thread);
// the bytes do not depend on the split.
void quantize_parallel(Type t, const float* src, void* dst, int64_t n, ThreadPool* pool);

// The K-quant rows (quantize_k.cpp).
void quantize_row_q2_k(const float* x, void* dst, int64_t n);
void quantize_row_q3_k(const float* x, void* dst, int64_t n);
void quantize_row_q4_k(const float* x, void* dst, int64_t n);
void quantize_row_q5_k(const float* x, void* dst, int64_t n);
void quantize_row_q6_k(const float* x, void* dst, int64_t n);
void quantize_row_q8_k(const float* x, void* dst, int64_t n);

// MXFP4's shared exponent (E8M0) for a block whose largest magnitude is amax; 0 for
// amax = 0.
uint8_t mxfp4_exponent(float amax);

}  // namespace kivi::quant

// Dequantization of GGUF rows to f32, exact: every value is what ggml's own to_float
// gives, bit for bit, including the sign of zero (ggml evaluates d * q, which is -0.0
// for q = 0 and a negative scale; the expressions here keep that shape). Scalar code,
// used for embedding lookups, the reference products and `kivi quantize`.
#pragma once

#include <cstdint>

#include "quant/types.h"

namespace kivi::quant {

// dst[n] = the values of the first n / block blocks at src. n must be a multiple of the
// type's block size.
void dequantize_row(Type t, const void* src, float* dst, int64_t n);

// bf16 -> f32 (exact widening) and f32 -> bf16 (round to nearest even; NaN stays NaN).
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

}  // namespace kivi::quant

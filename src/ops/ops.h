// Dense kernels of the forward pass. Each SIMD kernel (ops.cpp, qdot32.cpp, qdotk.cpp,
// compiled for every Highway target and dispatched at run time) has a plain scalar
// reference (ops_ref.cpp); tests compare them on random data.
//
// Weights may be F32, F16, BF16 (float dot products) or any block type of
// quant/types.h (integer dot products with activations quantized to 8 bits per block:
// ops/qkernels.h).
//
// Determinism: every output element of matvec/matmul is one dot product computed by
// one thread with a fixed accumulation order, so matmul over n tokens is bit-identical
// to n matvec calls, and results do not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/f16.h"
#include "quant/types.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::ops {

// The element type of a weight matrix: ggml's type (quant/types.h).
using DType = quant::Type;
const char* dtype_name(DType t);

// A row-major weight matrix [rows, cols], viewed in place (usually in a mapped file).
// A row is cols values of `dtype`: for the block types cols / block consecutive blocks
// (cols must be a multiple of the block size).
struct Matrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  const float* f32() const { return static_cast<const float*>(data); }
  const f16_t* f16() const { return static_cast<const f16_t*>(data); }
  size_t row_bytes() const {
    return static_cast<size_t>(quant::row_bytes(dtype, static_cast<uint64_t>(cols)));
  }
  size_t bytes() const { return row_bytes() * static_cast<size_t>(rows); }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + row_bytes() * static_cast<size_t>(r);
  }
};

// y[rows] = W[rows, cols] . x[cols]
void matvec(const Matrix& w, const float* x, float* y, ThreadPool* pool);

// y[n, rows] = x[n, cols] . W^T, bit-identical to n matvec calls.
void matmul(const Matrix& w, const float* x, int n, float* y, ThreadPool* pool);

// out[n] = weight[n] * x[n] / sqrt(mean(x^2) + eps)  (RMSNorm, Zhang & Sennrich 2019)
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);

// gate[n] = silu(gate[n]) * up[n]  (SwiGLU, Shazeer 2020)
void silu_mul(float* gate, const float* up, int n);
// gate[n] = gelu(gate[n]) * up[n] with GeLU's tanh approximation
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))  (GeGLU, Gemma)
void gelu_tanh_mul(float* gate, const float* up, int n);
// gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
// gate = g * sigmoid(alpha * g) * (u + 1) (alpha 1.702, limit 7).
void swiglu_oai_mul(float* gate, const float* up, int n, float alpha = 1.702f, float limit = 7.0f);
// x[n] = cap * tanh(x[n] / cap)  (Gemma 2's soft cap of logits and attention scores)
void softcap(float* x, size_t n, float cap);

// y[n] += x[n]
void add_inplace(float* y, const float* x, int n);

// In-place softmax over x[n].
void softmax(float* x, int n);

// Row `row` of a matrix as f32 (embedding lookup): exact dequantization of that row.
void copy_row(const Matrix& m, int64_t row, float* out);

// Bulk conversions; f32 -> f16 rounds to nearest even, like f32_to_f16.
void f16_to_f32_n(const f16_t* in, float* out, size_t n);
void f32_to_f16_n(const float* in, f16_t* out, size_t n);

// Dot product of two f32 vectors with the SIMD kernel's accumulation order.
float dot(const float* a, const float* b, size_t n);

// Scalar references (ops_ref.cpp), accumulating in double.
namespace ref {
// y = deq(W) . x over the exactly dequantized weights, in double, rounded once.
void matvec(const Matrix& w, const float* x, float* y);
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);
void softmax(float* x, int n);
double dot(const float* a, const float* b, size_t n);
}  // namespace ref

}  // namespace kivi::ops

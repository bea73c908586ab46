// Dense kernels of the forward pass. Each SIMD kernel (ops.cpp, compiled for every
// Highway target and dispatched at run time) has a plain scalar reference
// (ops_ref.cpp); tests compare them on random data.
//
// Determinism: every output element of matvec/matmul is one dot product computed by
// one thread with a fixed accumulation order, so matmul over n tokens is bit-identical
// to n matvec calls, and results do not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/f16.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::ops {

enum class DType : uint8_t { kF32 = 0, kF16 = 1 };
const char* dtype_name(DType t);
inline size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }

// A row-major weight matrix [rows, cols], viewed in place (usually in a mapped file).
struct Matrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  const float* f32() const { return static_cast<const float*>(data); }
  const f16_t* f16() const { return static_cast<const f16_t*>(data); }
  size_t bytes() const { return static_cast<size_t>(rows * cols) * dtype_size(dtype); }
};

// y[rows] = W[rows, cols] . x[cols]
void matvec(const Matrix& w, const float* x, float* y, ThreadPool* pool);

// y[n, rows] = x[n, cols] . W^T, bit-identical to n matvec calls.
void matmul(const Matrix& w, const float* x, int n, float* y, ThreadPool* pool);

// out[n] = weight[n] * x[n] / sqrt(mean(x^2) + eps)  (RMSNorm, Zhang & Sennrich 2019)
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);

// gate[n] = silu(gate[n]) * up[n]  (SwiGLU, Shazeer 2020)
void silu_mul(float* gate, const float* up, int n);

// y[n] += x[n]
void add_inplace(float* y, const float* x, int n);

// In-place softmax over x[n].
void softmax(float* x, int n);

// Row `row` of a matrix as f32 (embedding lookup).
void copy_row(const Matrix& m, int64_t row, float* out);

// Bulk conversions; f32 -> f16 rounds to nearest even, like f32_to_f16.
void f16_to_f32_n(const f16_t* in, float* out, size_t n);
void f32_to_f16_n(const float* in, f16_t* out, size_t n);

// Dot product of two f32 vectors with the SIMD kernel's accumulation order.
float dot(const float* a, const float* b, size_t n);

// Scalar references (ops_ref.cpp), accumulating in double.
namespace ref {
void matvec(const Matrix& w, const float* x, float* y);
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);
void softmax(float* x, int n);
double dot(const float* a, const float* b, size_t n);
}  // namespace ref

}  // namespace kivi::ops

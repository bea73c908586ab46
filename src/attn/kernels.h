// Internal interface between the attention driver (attention.cpp) and the
// per-target kernels (attention_kernels.cpp).
#pragma once

#include <cstddef>

#include "attn/attention.h"

namespace kivi::attn {

// One task: query heads [h * rep, (h + 1) * rep) against tokens [t0, t1) of KV head h.
struct TaskArgs {
  const kv::LayerView* kv = nullptr;
  int h = 0;
  int t0 = 0, t1 = 0;
  const float* q = nullptr;  // [rep][D], unscaled
  int rep = 1;
  float scale = 1.0f;
  const float* slopes = nullptr;  // [rep] ALiBi slopes or null
  int q_pos = 0;
  float* out = nullptr;  // per head r: out[r * out_stride + i]: o[0..D), then m, d
  int out_stride = 0;
  float* scratch = nullptr;
  int ld = 0;  // capacity of the score row per head (>= t1 - t0)
  Precision precision = Precision::kExact;
};

size_t kernel_scratch_floats(int rep, int head_dim, int block);

// Runs a task on the SIMD target chosen at run time.
void attend_range(const TaskArgs& a);

// y[i] = exp(x[i]) for x[i] <= 0 with the softmax's vector exp (0 below -87.3), on the
// SIMD target chosen at run time. For tests.
void exp_nonpositive(const float* x, float* y, int n);

// Whether the AVX3 target runs its 512-bit exact-path kernels (the default) or the
// 256-bit ones it shares with AVX2: for scores (float, f16 and int8 rows, KIVI keys) and
// for KIVI values. For tests, which compare the two.
void set_wide_exact_kernels(bool scores, bool kivi_values);

}  // namespace kivi::attn

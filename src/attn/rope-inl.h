// RoPE on staged key rows, per SIMD target: attention over keys stored before RoPE
// turns each staged row by its position (task.cpp for decode, prefill_task.cpp for
// query tiles).

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_ROPE_INL_H_
#undef KIVI_ATTN_ROPE_INL_H_
#else
#define KIVI_ATTN_ROPE_INL_H_
#endif

#include <cstddef>

#include <hwy/highway.h>

#include "attn/attention.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rotates rows x[n][D] of positions pos0, pos0 + 1, ... in place by their RoPE rows
// rope[pos][D/2][2] (cos, sin): for adjacent pairs, x C + swap(x) S with C = (c, c)
// and S = (-s, s) per pair, both read from the table row as it is.
inline void RotateRows(float* x, int n, int D, const float* rope, RopeStyle style) {
  const int half = D / 2;
  for (int i = 0; i < n; ++i) {
    float* xi = x + static_cast<size_t>(i) * D;
    const float* r = rope + static_cast<size_t>(i) * D;
#if HWY_TARGET != HWY_SCALAR
    const hn::ScalableTag<float> df;
    const int N = static_cast<int>(hn::Lanes(df));
    if (style == RopeStyle::kAdjacent && D % N == 0) {
      for (int d = 0; d < D; d += N) {
        const auto t = hn::LoadU(df, r + d), v = hn::LoadU(df, xi + d);
        const auto s = hn::DupOdd(t);
        hn::StoreU(
            hn::MulAdd(hn::Shuffle2301(v), hn::OddEven(s, hn::Neg(s)), hn::Mul(v, hn::DupEven(t))),
            df, xi + d);
      }
      continue;
    }
#endif
    for (int p = 0; p < half; ++p) {
      const int i0 = style == RopeStyle::kAdjacent ? 2 * p : p;
      const int i1 = style == RopeStyle::kAdjacent ? 2 * p + 1 : p + half;
      const float c = r[2 * p], s = r[2 * p + 1], a = xi[i0], b = xi[i1];
      xi[i0] = a * c - b * s;
      xi[i1] = a * s + b * c;
    }
  }
}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KIVI_ATTN_ROPE_INL_H_

#include "quant/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/f16.h"
#include "core/threadpool.h"
#include "quant/blocks.h"
#include "quant/dequant.h"

namespace kivi::quant {

namespace {

// trunc(v) clamped to [0, hi]; NaN gives 0. Equals min(hi, (int)v) for v in [0, hi + 1].
inline int trunc_clamp(float v, int hi) {
  if (!(v > 0.0f)) return 0;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// The value of largest magnitude (the first one on ties) and that magnitude.
inline float signed_max(const float* x, int n, float* amax_out) {
  float amax = 0.0f, m = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      m = x[j];
    }
  }
  *amax_out = amax;
  return m;
}

void q8_0(const float* x, BlockQ8_0* y) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = f32_to_f16(d);
  for (int j = 0; j < 32; ++j) {
    const float r = std::round(x[j] * id);  // |r| <= 127 for finite x; NaN gives 0
    y->qs[j] = static_cast<int8_t>(r >= 127.0f ? 127 : r <= -127.0f ? -127 : r == r ? r : 0.0f);
  }
}

void q4_0(const float* x, BlockQ4_0* y) {
  float amax;
  const float m = signed_max(x, 32, &amax);
  const float d = m / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = f32_to_f16(d);
  for (int j = 0; j < 16; ++j) {
    const int lo = trunc_clamp(x[j] * id + 8.5f, 15), hi = trunc_clamp(x[j + 16] * id + 8.5f, 15);
    y->qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void q5_0(const float* x, BlockQ5_0* y) {
  float amax;
  const float m = signed_max(x, 32, &amax);
  const float d = m / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = f32_to_f16(d);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = trunc_clamp(x[j] * id + 16.5f, 31), hi = trunc_clamp(x[j + 16] * id + 16.5f, 31);
    y->qs[j] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
    qh |= static_cast<uint32_t>(lo >> 4) << j;
    qh |= static_cast<uint32_t>(hi >> 4) << (j + 16);
  }
  std::memcpy(y->qh, &qh, 4);
}

// Q4_1 / Q5_1: the block's range [min, max] in 2^bits - 1 steps.
template <class B, int kMax>
void affine(const float* x, B* y) {
  float lo = FLT_MAX, hi = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / static_cast<float>(kMax);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = f32_to_f16(d);
  y->m = f32_to_f16(lo);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int a = trunc_clamp((x[j] - lo) * id + 0.5f, kMax),
              b = trunc_clamp((x[j + 16] - lo) * id + 0.5f, kMax);
    y->qs[j] = static_cast<uint8_t>((a & 15) | ((b & 15) << 4));
    qh |= static_cast<uint32_t>(a >> 4) << j;
    qh |= static_cast<uint32_t>(b >> 4) << (j + 16);
  }
  if constexpr (kMax == 31) std::memcpy(y->qh, &qh, 4);
}

// The code whose value kMxfp4Values[i] * d is nearest x (the lowest code on ties, so 0
// is code 0, never code 8; NaN gives code 0).
inline int mxfp4_nearest(float x, float d) {
  int best = 0;
  float best_err = std::fabs(static_cast<float>(kMxfp4Values[0]) * d - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(static_cast<float>(kMxfp4Values[i]) * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

void mxfp4(const float* x, BlockMXFP4* y) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
  }
  y->e = mxfp4_exponent(amax);
  const float d = e8m0_to_f32_half(y->e);
  for (int j = 0; j < 16; ++j) {
    y->qs[j] = static_cast<uint8_t>(mxfp4_nearest(x[j], d) | (mxfp4_nearest(x[j + 16], d) << 4));
  }
}

template <class B, void (*F)(const float*, B*)>
void blocks32(const float* x, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / 32; ++b) {
    B blk;
    F(x + 32 * b, &blk);
    std::memcpy(out + b * sizeof(B), &blk, sizeof(B));
  }
}

}  // namespace

uint8_t mxfp4_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;
  // floor(log2(amax)) - 2 + 127 in f32, as the format's reference computes it: the
  // largest magnitude is then 8 to 16 times the half scale 2^(e - 128), and values
  // above 12 times it clip to the largest code. The reference converts the float to
  // uint8_t with a C cast, which x86 compilers emit as a conversion to int32 (INT32_MIN
  // when out of range) keeping the low byte; the same here, so that blocks whose max
  // is below 2^-125 or infinite get the reference's exponents too.
  const float f = std::floor(std::log2(amax)) - 2.0f + 127.0f;
  const int32_t i = f >= -2147483648.0f && f < 2147483648.0f ? static_cast<int32_t>(f) : INT32_MIN;
  return static_cast<uint8_t>(static_cast<uint32_t>(i) & 0xffu);
}

void quantize_row(Type t, const float* src, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  switch (t) {
    case Type::kF32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      return;
    case Type::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case Type::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case Type::kQ8_0:
      return blocks32<BlockQ8_0, q8_0>(src, dst, n);
    case Type::kQ4_0:
      return blocks32<BlockQ4_0, q4_0>(src, dst, n);
    case Type::kQ5_0:
      return blocks32<BlockQ5_0, q5_0>(src, dst, n);
    case Type::kQ4_1:
      return blocks32<BlockQ4_1, affine<BlockQ4_1, 15>>(src, dst, n);
    case Type::kQ5_1:
      return blocks32<BlockQ5_1, affine<BlockQ5_1, 31>>(src, dst, n);
    case Type::kQ2_K:
      return quantize_row_q2_k(src, dst, n);
    case Type::kQ3_K:
      return quantize_row_q3_k(src, dst, n);
    case Type::kQ4_K:
      return quantize_row_q4_k(src, dst, n);
    case Type::kQ5_K:
      return quantize_row_q5_k(src, dst, n);
    case Type::kQ6_K:
      return quantize_row_q6_k(src, dst, n);
    case Type::kQ8_K:
      return quantize_row_q8_k(src, dst, n);
    case Type::kMXFP4:
      return blocks32<BlockMXFP4, mxfp4>(src, dst, n);
  }
}

}  // namespace kivi::quant

namespace kivi::quant {

void quantize_parallel(Type t, const float* src, void* dst, int64_t n, ThreadPool* pool) {
  const TypeInfo& ti = info(t);
  const int64_t blocks = n / ti.block;
  if (!pool || pool->size() == 1 || blocks < 64) {
    quantize_row(t, src, dst, n);
    return;
  }
  const int tasks =
      static_cast<int>(std::min<int64_t>(blocks / 16, static_cast<int64_t>(pool->size()) * 8));
  pool->run(tasks, [&](int task, int) {
    const int64_t b0 = blocks * task / tasks, b1 = blocks * (task + 1) / tasks;
    quantize_row(t, src + b0 * ti.block, static_cast<uint8_t*>(dst) + b0 * ti.block_bytes,
                 (b1 - b0) * ti.block);
  });
}

}  // namespace kivi::quant

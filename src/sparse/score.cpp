// Dot products of f16 rows with a float vector, compiled for every SIMD target
// (Highway foreach_target) and chosen at run time. Selection reads every summary once
// per step, so this is a stream of f16 loads: four rows at a time keep four independent
// accumulator chains in flight.
#include "sparse/score.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sparse/score.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kivi::sparse::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// Rows prefetched ahead of the four being scored.
constexpr size_t kAheadRows = 32;

HWY_INLINE hn::Vec<DF> LoadF16(DF df, const f16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}

void DotF16Rows(const f16_t* HWY_RESTRICT x, size_t stride, size_t n, const float* HWY_RESTRICT w,
                size_t len, float* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t body = len / N * N;
  auto tail = [&](const f16_t* row, float s) {
    for (size_t j = body; j < len; ++j) s += w[j] * f16_to_f32(row[j]);
    return s;
  };
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const f16_t* r0 = x + i * stride;
    const f16_t* r1 = r0 + stride;
    const f16_t* r2 = r1 + stride;
    const f16_t* r3 = r2 + stride;
    // The rows are one sequential stream; the hardware prefetcher alone keeps too few
    // lines in flight for it.
    if (i + 4 + kAheadRows <= n) {
      const char* ahead = reinterpret_cast<const char*>(x + (i + kAheadRows) * stride);
      for (size_t o = 0; o < 4 * stride * sizeof(f16_t); o += 64) hwy::Prefetch(ahead + o);
    }
    auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    for (size_t j = 0; j < body; j += N) {
      const auto wv = hn::LoadU(df, w + j);
      a0 = hn::MulAdd(LoadF16(df, r0 + j), wv, a0);
      a1 = hn::MulAdd(LoadF16(df, r1 + j), wv, a1);
      a2 = hn::MulAdd(LoadF16(df, r2 + j), wv, a2);
      a3 = hn::MulAdd(LoadF16(df, r3 + j), wv, a3);
    }
    out[i] = tail(r0, hn::GetLane(hn::SumOfLanes(df, a0)));
    out[i + 1] = tail(r1, hn::GetLane(hn::SumOfLanes(df, a1)));
    out[i + 2] = tail(r2, hn::GetLane(hn::SumOfLanes(df, a2)));
    out[i + 3] = tail(r3, hn::GetLane(hn::SumOfLanes(df, a3)));
  }
  for (; i < n; ++i) {
    const f16_t* r = x + i * stride;
    auto a = hn::Zero(df);
    for (size_t j = 0; j < body; j += N)
      a = hn::MulAdd(LoadF16(df, r + j), hn::LoadU(df, w + j), a);
    out[i] = tail(r, hn::GetLane(hn::SumOfLanes(df, a)));
  }
}

}  // namespace kivi::sparse::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kivi::sparse {

HWY_EXPORT(DotF16Rows);

void dot_f16_rows(const f16_t* x, size_t stride, size_t n, const float* w, size_t len, float* out) {
  HWY_DYNAMIC_DISPATCH(DotF16Rows)(x, stride, n, w, len, out);
}

void dot_f16_rows_ref(const f16_t* x, size_t stride, size_t n, const float* w, size_t len,
                      float* out) {
  for (size_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (size_t j = 0; j < len; ++j) s += static_cast<double>(w[j]) * f16_to_f32(x[i * stride + j]);
    out[i] = static_cast<float>(s);
  }
}

}  // namespace kivi::sparse
#endif  // HWY_ONCE

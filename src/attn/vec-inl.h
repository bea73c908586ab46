// Highway helpers shared by the attention kernels: the instruction-set macros, the
// choice of a vector width for a row length, row loads from every element type, and
// lane sums. Included inside HWY_NAMESPACE by each multi-target translation unit.

// Per-target include guard (Highway's toggle: re-read once per target).
#if defined(KIVI_ATTN_VEC_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_VEC_INL_H_
#undef KIVI_ATTN_VEC_INL_H_
#else
#define KIVI_ATTN_VEC_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>

#include "core/f16.h"

// KIVI_X86: raw AVX2 intrinsics are available (the AVX2 and AVX3 targets): the integer
// fast paths and the exact KIVI kernels that need lane permutes Highway does not offer.
// KIVI_X86_512: 512-bit intrinsics too (AVX3). AVX3_DL is not compiled: it enables the
// VEX encoding of VNNI, which faults on CPUs (AMD Zen 4) that have only the EVEX one.
#undef KIVI_X86
#undef KIVI_X86_512
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
#define KIVI_X86 1
#endif
#if HWY_TARGET == HWY_AVX3
#define KIVI_X86_512 1
#endif

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Calls f(tag) with the widest float tag, of at most 256 bits, whose lane count divides
// `multiple`. On AVX3 the kernels with whole-head shapes (four heads, head size a
// multiple of 16) choose 512-bit tags themselves (rows-inl.h, the KIVI kernels).
template <class F>
HWY_INLINE void WithTag(size_t multiple, const F& f) {
  const hn::CappedTag<float, 8> full;
  if (multiple % hn::Lanes(full) == 0) return f(full);
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 8> c8;
  if (hn::Lanes(c8) < hn::Lanes(full) && multiple % hn::Lanes(c8) == 0) return f(c8);
  const hn::CappedTag<float, 4> c4;
  if (hn::Lanes(c4) < hn::Lanes(full) && multiple % hn::Lanes(c4) == 0) return f(c4);
#endif
  const hn::CappedTag<float, 1> c1;
  return f(c1);
}

// One vector of a row as floats: f32, f16 or int8 elements.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadRow(DF df, const float* HWY_RESTRICT p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadRow(DF df, const f16_t* HWY_RESTRICT p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadRow(DF df, const int8_t* HWY_RESTRICT p) {
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<int8_t, DF> d8;
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, p)));
}

// Sum of all lanes of v.
template <class DF>
HWY_INLINE float SumLanes(DF df, hn::Vec<DF> v) {
  return hn::GetLane(hn::SumOfLanes(df, v));
}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard

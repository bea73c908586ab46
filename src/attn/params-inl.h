// Quantization parameters of the stored cache (kv/kv_cache.h's StreamView) as floats:
// a run of scales or zero points, and the scales of a tile of int8 rows at each
// granularity.

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_PARAMS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_PARAMS_INL_H_
#undef KIVI_ATTN_PARAMS_INL_H_
#else
#define KIVI_ATTN_PARAMS_INL_H_
#endif

#include <algorithm>
#include <cstring>

#include "attn/vec-inl.h"
#include "kv/kv_cache.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Quantization parameters [index, index + count) of a stream (scales, or zero points)
// as floats.
inline void LoadParams(const kv::StreamView& st, size_t index, int count, float* out,
                       bool zeros = false) {
  const uint8_t* base = zeros ? st.zeros : st.scales;
  if (st.param_type == kv::ParamType::kF32) {
    std::memcpy(out, reinterpret_cast<const float*>(base) + index,
                static_cast<size_t>(count) * sizeof(float));
    return;
  }
  const f16_t* p = reinterpret_cast<const f16_t*>(base) + index;
  int i = 0;
  // Full vectors, then (on targets wider than 8 lanes) one of 8, then one at a time.
  auto convert = [&](auto df) {
    const hn::Rebind<hwy::float16_t, decltype(df)> dh;
    const int N = static_cast<int>(hn::Lanes(df));
    for (; i + N <= count; i += N) {
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p + i))),
                 df, out + i);
    }
  };
  convert(hn::ScalableTag<float>());
  convert(hn::CappedTag<float, 8>());
  for (; i < count; ++i) out[i] = f16_to_f32(p[i]);
}

// The scales of int8 rows [t0, t0 + n) of head h (within one block): one per row in
// row_scale[n] (tensor, token and head granularities), or one per group of Gc
// channels in group_scale[n][D/Gc] (group granularity).
inline void LoadInt8Scales(const kv::StreamView& st, int t0, int h, int n, float* row_scale,
                           float* group_scale) {
  const size_t slot = static_cast<size_t>(t0 % st.block);
  switch (st.fmt.granularity) {
    case kv::Int8Granularity::kTensor:
      std::fill(row_scale, row_scale + n, st.tensor_scale);
      break;
    case kv::Int8Granularity::kToken:
      LoadParams(st, st.token_param_index(t0), n, row_scale);
      break;
    case kv::Int8Granularity::kHead:
      LoadParams(st, st.param_base(t0, h) + slot, n, row_scale);
      break;
    case kv::Int8Granularity::kGroup: {
      const int per_row = st.head_dim / st.group;
      LoadParams(st, st.param_base(t0, h) + slot * per_row, n * per_row, group_scale);
      break;
    }
  }
}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard

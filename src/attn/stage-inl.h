// Staging of stored tokens as floats, per SIMD target: one block's run of a stream's
// tokens dequantized into rows, whatever the format (the decode task's pre-RoPE and
// staged paths, task.cpp, and the tiled prefill, prefill_task.cpp).

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_STAGE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_STAGE_INL_H_
#undef KIVI_ATTN_STAGE_INL_H_
#else
#define KIVI_ATTN_STAGE_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include <hwy/highway.h>

#include "attn/kernels-inl.h"
#include "attn/params-inl.h"
#include "kv/kv_cache.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {

// tq rows [t0, t0 + n) of head h (one block) in the head's rotated space (no rotation
// back) into out[n][D]; rs: [n] their scales.
inline void StageTqRotated(const kv::StreamView& s, int h, int t0, int n, float* out, float* rs) {
  LoadParams(s, s.param_base(t0, h) + static_cast<size_t>(t0 % s.block), n, rs);
  DecodeTqRows(*s.tq, s.row(t0, h), s.token_stride, n, rs, out);
}

// Stored tokens [t0, t0 + n) of head h (one block) dequantized as stored (rotated streams
// in the rotated space) into out[n][D]; the arguments as StageStored's.
inline void StageStoredAsStored(const kv::StreamView& s, int h, int t0, int n, float* out,
                                float* ps, float* pz, float* sp, float* zp, float* rs) {
  const int D = s.head_dim;
  if (s.tq) return StageTqRotated(s, h, t0, n, out, rs);
  switch (s.fmt.format) {
    case kv::Format::kF32:
      StageRows(reinterpret_cast<const float*>(s.row(t0, h)), s.token_stride / 4, n, D, out);
      return;
    case kv::Format::kF16:
      StageRows(reinterpret_cast<const f16_t*>(s.row(t0, h)), s.token_stride / 2, n, D, out);
      return;
    case kv::Format::kInt8: {
      const bool grp = s.fmt.granularity == kv::Int8Granularity::kGroup;
      LoadInt8Scales(s, t0, h, n, rs, ps);
      DequantInt8(reinterpret_cast<const int8_t*>(s.row(t0, h)), s.token_stride, n, D, rs,
                  grp ? ps : nullptr, s.group, grp ? D / s.group : 0, out);
      return;
    }
    default:
      break;
  }
  const int bits = kv::format_bits(s.fmt.format);
  if (s.per_channel) {  // KIVI keys: group by group, each with its D scales and zeros
    const int G = s.group;
    for (int g0 = t0; g0 < t0 + n;) {
      const int g1 = std::min(t0 + n, (g0 / G + 1) * G);
      const size_t pi = s.group_params(g0, h);
      LoadParams(s, pi, D, sp);
      LoadParams(s, pi, D, zp, true);
      DequantKiviKeys(s.group_codes(g0, h), G, g0 % G, g1 - g0, D, bits, sp, zp,
                      out + static_cast<size_t>(g0 - t0) * D);
      g0 = g1;
    }
    return;
  }
  // KIVI values: per-token parameters per group of Gc channels.
  const int Gc = s.group, NG = D / Gc;
  const size_t pi = s.param_base(t0, h) + static_cast<size_t>(t0 % s.block) * NG;
  LoadParams(s, pi, n * NG, ps);
  LoadParams(s, pi, n * NG, pz, true);
  DequantKiviValues(s.quad_row(t0, h), t0 % 4, n, D, bits, Gc, ps, pz, static_cast<size_t>(NG),
                    out);
}

// Stored tokens [t0, t0 + n) of head h (one block) dequantized into out[n][D], in the
// original space (rotated streams rotated back row by row).
// ps, pz: [n][D] parameter staging (int8 group scales, KIVI value scales and zero
// points); sp, zp: [D] (a KIVI key group's); rs: [n] (int8 and tq row scales).
inline void StageStored(const kv::StreamView& s, int h, int t0, int n, float* out, float* ps,
                        float* pz, float* sp, float* zp, float* rs) {
  StageStoredAsStored(s, h, t0, n, out, ps, pz, sp, zp, rs);
  if (!s.rotated) return;
  for (int i = 0; i < n; ++i) s.rotations[h].inverse(out + static_cast<size_t>(i) * s.head_dim);
}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KIVI_ATTN_STAGE_INL_H_

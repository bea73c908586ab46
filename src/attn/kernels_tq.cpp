// The tq row decoder, compiled for every SIMD target (tq-inl.h), and its dispatching entry
// point for tests.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attn/kernels_tq.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "attn/kernels-inl.h"
#include "attn/tq-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {

void DecodeTqRows(const kv::TqCodec& c, const uint8_t* rows, size_t stride, int n, const float* rs,
                  float* out) {
  DecodeTqRowsImpl(c, rows, stride, n, rs, out);
}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kivi::attn {

HWY_EXPORT(DecodeTqRows);

void decode_tq_rows(const kv::TqCodec& c, const uint8_t* rows, size_t stride, int n,
                    const float* rs, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeTqRows)(c, rows, stride, n, rs, out);
}

}  // namespace kivi::attn
#endif  // HWY_ONCE

// The row-format kernels (f32, f16, int8), compiled for every SIMD target: explicit
// instantiations of the row kernels and staging for each element type, int8 staging and the fast
// int8 key kernel (rows-inl.h, int8-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attn/kernels_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "attn/int8-inl.h"
#include "attn/kernels-inl.h"
#include "attn/rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {

template void DotRows<float>(const float*, int, int, const float*, size_t, int, float*, int,
                             Prefetcher&);
template void DotRows<f16_t>(const float*, int, int, const f16_t*, size_t, int, float*, int,
                             Prefetcher&);
template void DotRows<int8_t>(const float*, int, int, const int8_t*, size_t, int, float*, int,
                              Prefetcher&);
template void AccumRows<float>(const float*, int, int, int, const float*, size_t, int, float*,
                               size_t, Prefetcher&);
template void AccumRows<f16_t>(const float*, int, int, int, const f16_t*, size_t, int, float*,
                               size_t, Prefetcher&);
template void AccumRows<int8_t>(const float*, int, int, int, const int8_t*, size_t, int, float*,
                                size_t, Prefetcher&);
template void StageRows<float>(const float*, size_t, int, int, float*);
template void StageRows<f16_t>(const f16_t*, size_t, int, int, float*);

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// Integer kernels for block-quantized weights (internal to ops/): the activations of a
// product are quantized once per call, per block, to 8 bits, and each weight block's
// integer codes are multiplied with them in integer arithmetic (vpmaddubsw + vpmaddwd
// on AVX2, vpdpbusd with AVX512-VNNI), one float multiply-add per block.
//
//   32-value weight types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4): activations in blocks
//     of 32, x ~ dx * qx (dx = max|x| / 127, qx = round_half_even(x * (127 / max|x|)),
//     the rounding ggml's x86 code uses for its q8_0 activations), with the block's
//     sx = dx * sum(qx) for the types with a min. Per weight block:
//       Q8_0, Q4_0, Q5_0: dw * dx * sum(qw * qx)       (qw signed: q - 8, q - 16)
//       MXFP4:            2^(e-128) * dx * sum(v[q] * qx)  (v: the 16 doubled E2M1 values)
//       Q4_1, Q5_1:       dw * dx * sum(qw * qx) + m * sx
//   K-quants (Q2_K .. Q6_K): activations as Q8_K (super-blocks of 256 with an f32 scale
//     and the sums of each 16 codes, bsums), so the mins and code offsets are one
//     vpmaddwd of bsums with the sub-block mins or scales:
//       Q4_K/Q5_K/Q2_K: d * dx * sum_j sc_j sum(q x) - dmin * dx * sum_j m_j bsum_j
//       Q6_K/Q3_K:      d * dx * (sum_j sc_j sum(q x) - o * sum_j sc_j bsum_j), o = 32 / 4
//
// Each (row, token) result is one accumulation in a fixed order whatever the number of
// tokens computed together (tiles share the weight loads, not the arithmetic), so a
// batch gives the bits of one call per token, and rows are independent (threads split
// rows). Non-x86 targets (and SSE4/SSSE3) run the same arithmetic in scalar code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace kivi::ops::detail {

enum class ActKind : uint8_t { kNone, kQ8x32, kQ8x256 };

// How the activations of weight type `t` are quantized (kNone for F32/F16/BF16).
inline ActKind act_kind(quant::Type t) {
  if (quant::is_float(t)) return ActKind::kNone;
  return quant::is_k_quant(t) ? ActKind::kQ8x256 : ActKind::kQ8x32;
}

// One token's quantized activations of `cols` values, at 64-byte aligned offsets:
//   q     int8  [cols]
//   d     f32   [nb]        block scales
//   s     f32   [nb]        kQ8x32: dx * sum(qx) per block
//   bsums int16 [nb * 16]   kQ8x256: sums of each 16 codes
struct ActLayout {
  size_t q = 0, d = 0, extra = 0, bytes = 0;
};
inline ActLayout act_layout(ActKind k, int64_t cols) {
  auto up = [](size_t b) { return (b + 63) / 64 * 64; };
  const size_t n = static_cast<size_t>(cols);
  const size_t nb = k == ActKind::kQ8x256 ? n / 256 : n / 32;
  ActLayout l;
  l.q = 0;
  l.d = up(n);
  l.extra = l.d + up(nb * 4);
  l.bytes = l.extra + up(k == ActKind::kQ8x256 ? nb * 32 : nb * 4);
  return l;
}

// Quantizes x[cols] of one token into `out` (act_layout bytes, 64-byte aligned), on the
// SIMD target chosen at run time. Every target gives the same bytes.
void quantize_acts(ActKind k, const float* x, int64_t cols, uint8_t* out);

// y[t * ldy + r] for rows [r0, r1) of the quantized matrix `w` (row_bytes per row, cols
// values) and tokens t in [0, n) whose activations start at acts + t * act_stride.
void quant_rows(quant::Type t, const uint8_t* w, size_t row_bytes, int64_t cols,
                const uint8_t* acts, size_t act_stride, int n, float* y, size_t ldy, size_t r0,
                size_t r1);

// Whether the kernels may use AVX512-VNNI where the CPU has it (default true). Tests
// turn it off to run the paths of AVX-512 CPUs without VNNI; results are the same bits.
void set_vnni_allowed(bool allowed);
// The CPU has AVX512-VNNI and the kernels may use it.
bool use_vnni();

// Per-file entry points of the two kernel files (qdot32.cpp, qdotk.cpp).
void quantize_acts32(const float* x, int64_t cols, uint8_t* out);
void quantize_acts256(const float* x, int64_t cols, uint8_t* out);
void rows32(quant::Type t, const uint8_t* w, size_t row_bytes, int64_t cols, const uint8_t* acts,
            size_t act_stride, int n, float* y, size_t ldy, size_t r0, size_t r1);
void rowsk(quant::Type t, const uint8_t* w, size_t row_bytes, int64_t cols, const uint8_t* acts,
           size_t act_stride, int n, float* y, size_t ldy, size_t r0, size_t r1);

}  // namespace kivi::ops::detail

// Quantizers of the KV cache formats, callable on their own (the cache calls them on
// slices of its blocks). All functions are scalar and exact to the specification
// below; the attention kernels read what these write.
//
// KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache",
// arXiv 2402.02750, Sec. 3): asymmetric min/max quantization with B = bits,
// L = 2^B - 1 levels:
//   scale = (max - min) / L,  zero = min,  q = clamp(rint((x - zero) / scale), 0, L),
//   x' = q * scale + zero                       (rint: round half to even)
// With f16 parameters the stored zero is min rounded toward -inf and the stored scale
// (max - zero) / L rounded toward +inf, so [zero, zero + L*scale] still covers the
// data and |x - x'| <= scale / 2 holds for the stored scale. A constant group has
// scale 0, codes 0 and reconstructs as the (stored) zero.
//
// Packing: the D codes of a token row are packed into W = D * bits / 8 bytes, byte j
// holding channels j, j + W, j + 2W, ... from the low bits up:
//   2-bit: byte j = c[j] | c[j+W] << 2 | c[j+2W] << 4 | c[j+3W] << 6
//   4-bit: byte j = c[j] | c[j+W] << 4            (low nibble first)
//   8-bit: byte j = c[j]
// (llama.cpp's q4_0 splits the two halves of a block across nibbles the same way.)
// Shifting a vector of row bytes right by bits * k and masking yields channels
// kW .. kW + W - 1 in order, so SIMD kernels unpack without shuffles.
//
// Key groups: the G packed rows of a key group are stored interleaved in 32-bit words.
// Word c of token i (row bytes 4c .. 4c + 3) is at byte offset 4 (c G + i) of the group,
// so word c of all G tokens is contiguous and a vector of 32-bit lanes holds it for
// consecutive tokens: a kernel computes the scores of many tokens at once, with no
// reduction across channels. Within the word the row bytes 4c, 4c + 1, 4c + 2, 4c + 3
// sit at positions 0, 2, 1, 3: the low 16-bit half holds row bytes 4c and 4c + 2, the
// high half 4c + 1 and 4c + 3, so the same bit offset in the two halves holds row bytes
// 4c + r and 4c + r + 1 (r = 0, 2), i.e. two adjacent channels, and one shift and mask
// give the int16 pairs vpmaddwd multiplies. Rows of W bytes, W not a multiple of 4, are
// interleaved in units of u = 2 or 1 bytes instead (offset (j / u) G u + i u + j % u,
// no reordering); u = W is the plain sequence of rows.
//
// int8 (symmetric absmax): scale = absmax / 127, q = clamp(rint(x / scale), -127, 127),
// x' = q * scale; f16 scales are rounded toward +inf.
//
// Shapes use S = number of independent slices (batch x heads), T = tokens,
// D = head_dim, G = group size, P = param type size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kv/format.h"

namespace kivi::kv {

// Quantization parameters of one group, as stored.
struct QParams {
  float scale;
  float zero;
};

// min/max -> stored (scale, zero) for `bits`, following the rounding rules above.
QParams kivi_params(float mn, float mx, int bits, ParamType pt);
// One value -> code.
uint8_t kivi_code(float x, QParams p, int bits);
// Absmax -> stored int8 scale.
float int8_scale(float absmax, ParamType pt);
// One value -> int8 code; sets *clamped when |x / scale| rounds past 127.
int8_t int8_code(float x, float scale, bool* clamped = nullptr);

// Parameter storage helpers (P = 2 for f16, 4 for f32).
void store_param(void* base, size_t index, float v, ParamType pt);
float load_param(const void* base, size_t index, ParamType pt);

// Packed bytes of one row of D codes.
inline size_t packed_row_bytes(int head_dim, int bits) {
  return static_cast<size_t>(head_dim) * bits / 8;
}
// Code `i` of a packed row of D codes.
uint8_t unpack_code(const uint8_t* row, int i, int bits, int D);
void pack_code(uint8_t* row, int i, int bits, int D, uint8_t code);

// Within a word of a key group, row byte 4c + r sits at position kKeyWordOrder[r]; the
// order is its own inverse, so position p holds row byte 4c + kKeyWordOrder[p].
inline constexpr int kKeyWordOrder[4] = {0, 2, 1, 3};

// Offset of byte j of token i (< G) within a key group of G rows of W bytes (above).
inline size_t key_group_offset(int i, int j, int W, int G) {
  if (W % 4 == 0) return (static_cast<size_t>(j / 4) * G + i) * 4 + kKeyWordOrder[j % 4];
  const int u = W % 2 == 0 ? 2 : 1;
  return (static_cast<size_t>(j / u) * G + i) * u + j % u;
}

// Keys, per channel over groups of G consecutive tokens (T a multiple of G):
//   keys  [S, T, D] f32
//   codes [S, T / G, G * D * bits / 8] u8   (each group's rows interleaved, above)
//   scale [S, T / G, D], zero [S, T / G, D]   (param type pt)
void quantize_keys(const float* keys, int S, int T, int D, int G, int bits, ParamType pt,
                   uint8_t* codes, void* scale, void* zero);
void dequantize_keys(const uint8_t* codes, const void* scale, const void* zero, int S, int T, int D,
                     int G, int bits, ParamType pt, float* keys);

// Values, per token over groups of G consecutive channels (G divides D):
//   values [S, T, D] f32
//   codes  [S, T, D * bits / 8] u8
//   scale  [S, T, D / G], zero [S, T, D / G]
void quantize_values(const float* values, int S, int T, int D, int G, int bits, ParamType pt,
                     uint8_t* codes, void* scale, void* zero);
void dequantize_values(const uint8_t* codes, const void* scale, const void* zero, int S, int T,
                       int D, int G, int bits, ParamType pt, float* values);

// int8 at a granularity, for T tokens of H heads (x [T, H, D], the layout of a K or V
// projection row):
//   codes  [T, H, D] i8
//   scales tensor: [1] (given, not computed: the caller fixes it at calibration)
//          token:  [T]          head: [T, H]          group: [T, H, D / G]
// Returns the number of clamped elements (only possible for kTensor).
int64_t quantize_int8(const float* x, int T, int H, int D, Int8Granularity g, int G, ParamType pt,
                      int8_t* codes, void* scales, float tensor_scale = 0.0f);
void dequantize_int8(const int8_t* codes, const void* scales, int T, int H, int D,
                     Int8Granularity g, int G, ParamType pt, float* x, float tensor_scale = 0.0f);

}  // namespace kivi::kv
